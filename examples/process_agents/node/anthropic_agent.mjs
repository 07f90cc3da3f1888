// The calculator task on the official `@anthropic-ai/sdk` npm package: messages.create with `tools`
// (input_schema), the model's `tool_use` blocks run against the tool server and answered with
// `tool_result` blocks, until it answers in text. agentrl runs it as a process per episode:
// ANTHROPIC_BASE_URL is the episode's session (<server>/sessions/<id>, no /v1: the SDK adds /v1/messages),
// ANTHROPIC_API_KEY its key. The task is JSON on stdin; the reward goes to $AGENTRL_REWARD_FILE.
//
//   npm ci --prefix examples/process_agents/node
//   python -m rewards.servers.tools --port 8765 &
//   python -m agentrl.serve --model default --port 8000 &
//   echo '{"a": 437, "op": "*", "b": 89, "answer": 38893}' | \
//     ANTHROPIC_BASE_URL=http://127.0.0.1:8000 ANTHROPIC_API_KEY=unused node examples/process_agents/node/anthropic_agent.mjs
import Anthropic from "@anthropic-ai/sdk";
import { MAX_TURNS, MODEL, lastNumber, listTools, main, numericMatch, prompt, runTool } from "./calculator.mjs";

const MAX_TOKENS = Number(process.env.AGENTRL_MAX_TOKENS || 128); // the Messages API requires it

async function solve(task) {
  const client = new Anthropic({ maxRetries: 0 }); // ANTHROPIC_BASE_URL, ANTHROPIC_API_KEY from the environment
  const tools = (await listTools()).map(({ function: f }) => (
    { name: f.name, description: f.description, input_schema: f.parameters }));
  const names = tools.map((t) => t.name);
  const { system, question } = prompt(task, names);
  const messages = [{ role: "user", content: question }];
  let toolSuccess = false;
  for (let turn = 0; turn < MAX_TURNS; turn++) {
    const out = await client.messages.create({ model: MODEL, max_tokens: MAX_TOKENS, system, messages, tools });
    messages.push({ role: "assistant", content: out.content }); // as returned: the next request extends the ledger
    const calls = out.content.filter((block) => block.type === "tool_use");
    if (calls.length) {
      const results = [];
      for (const call of calls) {
        const [content, ran] = await runTool(names, call.name, call.input);
        toolSuccess ||= ran;
        results.push({ type: "tool_result", tool_use_id: call.id, content });
      }
      messages.push({ role: "user", content: results });
      continue;
    }
    const text = out.content.filter((block) => block.type === "text").map((block) => block.text).join("");
    if (lastNumber(text) === null) {
      messages.push({ role: "user", content: "Reply with a number, or call a tool." });
      continue;
    }
    const reward = numericMatch(text, task.answer);
    return { reward, success: reward === 1.0, tool_success: toolSuccess, turns: turn + 1 };
  }
  return { reward: 0.0, success: false, tool_success: toolSuccess, turns: MAX_TURNS };
}

await main(solve);
