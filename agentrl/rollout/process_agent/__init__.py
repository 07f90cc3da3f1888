"""Agents that are their own process: train the model behind ANY program that speaks the OpenAI or
Anthropic API, in any language, unchanged.

    env:
      import_path: agentrl.rollout.process_agent:ProcessAgentEnv
      kwargs:
        command: ["{python}", "-I", "{run_cwd}/examples/agents/process_calculator.py"]   # argv, no shell
        stdin: json          # json (default): the task as one JSON object on stdin, then EOF; none
        env: {CALCULATOR_TOOL_URL: "http://127.0.0.1:8765"}   # extra variables (templates allowed)
        reward: process      # process (default): the program writes {reward_file}; sources: rewards.sources
        sandbox: false       # true: bubblewrap, network only to the episode's session
        output_bytes: 8192   # the tail of stdout and of stderr kept for an error report
    data:
      task_kwargs: {tasks_from: "envs.calculator:CalculatorEnv", low: 10, high: 99}  # or data.train_path

Per episode the run makes a fresh working directory (under a folder of its own in the temp directory,
removed after the episode), writes the task there as `task.json`, starts `command` in it in a process
group of its own, waits for it within `rollout.episode_timeout_s`, then SIGKILLs the whole group, and
scores it. The tokens trained on are those of the episode's session: every request the program makes
to its base URL is recorded by the session's ledger (agentrl.rollout.session).

Templates in `command` and `env` values: {task_file} (the task as JSON), {reward_file} (where the program
writes its reward), {workdir} (its working directory), {python} (the trainer's interpreter), {run_cwd}
(the directory the run started in: relative paths in argv are from {workdir}, not from there).

The program's environment, and nothing else of the trainer's (its secrets stay out):
  PATH, HOME, LANG, LC_ALL, TZ      the trainer's own, when set (HOME is {workdir} in the sandbox)
  env.kwargs.env                   as configured
  OPENAI_BASE_URL                  the session's base URL, .../sessions/<sid>/v1 (point any OpenAI client at it)
  OPENAI_API_KEY                   the run's token for it (the endpoint refuses requests without it)
  ANTHROPIC_BASE_URL               the same without the trailing /v1 (the Anthropic SDKs append /v1/messages)
  ANTHROPIC_API_KEY                the same token (sent as x-api-key)
  AGENTRL_TASK_FILE, AGENTRL_REWARD_FILE, AGENTRL_WORKDIR   {task_file}, {reward_file}, {workdir}

The reward (reward: process): before exiting 0 the program writes one JSON object to {reward_file},
`{"reward": <finite number>, "success": <bool>, ...}`; the other keys go to the episode's info["env"]
("success" feeds the success rate, "tool_success" the tool-call success rate). With reward: sources the
file is not read and `rewards.sources` score the conversation.

How an episode ends (Episode.status, Episode.error), never a silent 0:
  ok            exited 0 after calling the model, with a valid reward file (or reward: sources)
  env_error     "the agent process exited with code N: <stderr's last line>"
                "the agent process was killed by SIGSEGV: ..." (a signal)
                "the agent process exited 0 without writing its reward file ..." / "... is not JSON ..." /
                "... has reward 'x' ...": the reward file and what is wrong with it
                "the agent returned without making a request": it never called the model
                "cannot start the agent process ...": the command is not there or not executable
                (stdout's and stderr's last `output_bytes` are in Episode.traceback)
  timeout       still running at rollout.episode_timeout_s (its group is killed), or one generation over
                rollout.turn_timeout_s
  engine_error  the engine failed one of its requests (even when the program carried on)
  truncated     the session refused a request over rollout.max_turns or the context: trained with its reward

A program that leaves its process group (setsid, a daemon's double fork) escapes the group kill unless
it runs sandboxed; in the sandbox (agentrl.rollout.process_agent.sandbox) its pid namespace dies with it.
"""

from agentrl.rollout.process_agent.env import ProcessAgentEnv

__all__ = ["ProcessAgentEnv"]
