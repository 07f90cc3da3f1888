// What the two agents share: the episode's contract with agentrl (task JSON on stdin, the reward written
// as JSON to the file named by AGENTRL_REWARD_FILE), the reference tool server's HTTP API
// (`python -m rewards.servers.tools`), and the calculator task's reward (rewards.rules.numeric_match).
// Nothing here knows about training; the SDK clients in the agents read their base URL and key from the
// standard environment variables that agentrl sets per episode.
import { readFileSync, writeFileSync } from "node:fs";

export const TOOL_URL = (process.env.CALCULATOR_TOOL_URL || "http://127.0.0.1:8765").replace(/\/+$/, "");
export const MODEL = process.env.AGENTRL_MODEL || "agentrl";
export const MAX_TURNS = Number(process.env.AGENTRL_MAX_TURNS || 3);
export const RESULT_CHARS = 32; // tool results cut as CalculatorEnv cuts them (the warm start saw 32 bytes)

/** The task: JSON on stdin ({"a", "op", "b", "answer", ...} for the calculator). */
export function readTask() {
  const text = readFileSync(0, "utf8");
  return JSON.parse(text);
}

/** The episode's outcome: {"reward": x, ...} to $AGENTRL_REWARD_FILE, or to stdout when run by hand. */
export function writeReward(result) {
  const line = JSON.stringify(result);
  if (process.env.AGENTRL_REWARD_FILE) writeFileSync(process.env.AGENTRL_REWARD_FILE, line + "\n");
  else process.stdout.write(line + "\n");
}

/** The tool server's tools in OpenAI's function shape: [{type: "function", function: {name, description, parameters}}]. */
export async function listTools() {
  const response = await fetch(`${TOOL_URL}/tools`);
  if (!response.ok) throw new Error(`tool server ${TOOL_URL}/tools: HTTP ${response.status}`);
  return (await response.json()).tools;
}

/** Runs one tool call: [content for the model, whether the tool ran]. A tool server failure throws. */
export async function runTool(names, name, args) {
  if (!names.includes(name)) return [`error: unknown tool '${name}'; tools: ${[...names].sort().join(", ")}`, false];
  const response = await fetch(`${TOOL_URL}/call`, {
    method: "POST", headers: { "content-type": "application/json" }, body: JSON.stringify({ name, arguments: args }),
  });
  if (!response.ok) throw new Error(`tool server ${TOOL_URL}/call: HTTP ${response.status}`);
  const body = await response.json();
  return [String(body.content).slice(0, RESULT_CHARS), !body.is_error];
}

/** The system prompt and question the embedded model's calculator warm start saw (envs.calculator). */
export function prompt(task, names) {
  return { system: `Tools: ${names.join(", ")}.`, question: `What is ${task.a} ${task.op} ${task.b}?` };
}

// rewards.rules.last_number / numeric_match
const NUMBER = /[-+]?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?(?:[eE][-+]?\d+)?|[-+]?\.\d+(?:[eE][-+]?\d+)?/g;

export function lastNumber(text) {
  const matches = (text || "").match(NUMBER);
  return matches ? Number(matches[matches.length - 1].replaceAll(",", "")) : null;
}

export function numericMatch(text, answer, tol = 1e-6) {
  const target = typeof answer === "number" ? answer : lastNumber(String(answer));
  const pred = lastNumber(text);
  if (pred === null || !Number.isFinite(pred)) return 0.0;
  return Math.abs(pred - target) <= Math.max(tol, tol * Math.abs(target)) ? 1.0 : 0.0;
}

/** Runs `solve(task)` as the process's episode: the reward written, exit 0; an error is exit 1 (stderr says why). */
export async function main(solve) {
  try {
    const result = await solve(readTask());
    writeReward(result);
  } catch (err) {
    process.stderr.write(`${err?.stack || err}\n`);
    process.exitCode = 1;
  }
}
