// The calculator task as a plain tool-calling loop on the official `openai` npm package (chat completions
// with tools), the Node twin of examples/agents/openai_agent.py's `solve`. agentrl runs it as a process per
// episode: OPENAI_BASE_URL is the episode's session (<server>/sessions/<id>/v1), whose ledger records every
// token; OPENAI_API_KEY its key. The task is JSON on stdin; the reward goes to $AGENTRL_REWARD_FILE.
//
//   npm ci --prefix examples/process_agents/node
//   python -m rewards.servers.tools --port 8765 &
//   python -m agentrl.serve --model default --port 8000 &
//   echo '{"a": 437, "op": "*", "b": 89, "answer": 38893}' | \
//     OPENAI_BASE_URL=http://127.0.0.1:8000/v1 OPENAI_API_KEY=unused node examples/process_agents/node/openai_agent.mjs
import OpenAI from "openai";
import { MAX_TURNS, MODEL, lastNumber, listTools, main, numericMatch, prompt, runTool } from "./calculator.mjs";

async function solve(task) {
  const client = new OpenAI({ maxRetries: 0 }); // OPENAI_BASE_URL, OPENAI_API_KEY from the environment
  const tools = await listTools();
  const names = tools.map((t) => t.function.name);
  const { system, question } = prompt(task, names);
  const messages = [{ role: "system", content: system }, { role: "user", content: question }];
  let toolSuccess = false;
  for (let turn = 0; turn < MAX_TURNS; turn++) {
    const out = await client.chat.completions.create({ model: MODEL, messages, tools });
    const reply = out.choices[0].message;
    messages.push(reply); // the reply as returned: the next request extends the session's ledger
    if (reply.tool_calls?.length) {
      for (const call of reply.tool_calls) {
        let args;
        try {
          args = JSON.parse(call.function.arguments);
        } catch (err) {
          messages.push({ role: "tool", tool_call_id: call.id, content: `error: arguments are not JSON: ${err.message}`.slice(0, 32) });
          continue;
        }
        const [content, ran] = await runTool(names, call.function.name, args);
        toolSuccess ||= ran;
        messages.push({ role: "tool", tool_call_id: call.id, content });
      }
      continue;
    }
    if (lastNumber(reply.content) === null) {
      messages.push({ role: "user", content: "Reply with a number, or call a tool." });
      continue;
    }
    const reward = numericMatch(reply.content, task.answer);
    return { reward, success: reward === 1.0, tool_success: toolSuccess, turns: turn + 1 };
  }
  return { reward: 0.0, success: false, tool_success: toolSuccess, turns: MAX_TURNS };
}

await main(solve);
