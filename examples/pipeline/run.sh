#!/usr/bin/env bash
# SFT -> RM -> PPO on the embedded default model and the guess-the-number task (see README.md here).
#
#   bash examples/pipeline/run.sh                 # ~14 min on 2 idle CPU cores, 300 RL steps
#   RL_STEPS=40 bash examples/pipeline/run.sh     # a smoke run (40 steps: within the eval's noise)
#
# Variables: OUT (runs/pipeline), RL_STEPS (300: 40 gave +0.03 held-out, 120 +0.08, 300 +0.25), SFT_STEPS (300), RM_STEPS (150), SAMPLES (4, the
# held-out eval's samples per task), EVAL_TASKS (128, its tasks, and PPO's in-run evals'), REWARD (env+rm: the env's reward + 0.1 x the RM's score; rm: the RM's
# score alone, which PPO learns to game; its run is $OUT/ppo_rm, beside the default's $OUT/ppo), PYTHON (.venv/bin/python when
# there is one, else python), FRESH (1: run every stage again; by default a stage is reused when it and every stage before
# it ran the same command on the same files and code in $OUT to the end (stages.sh), so `REWARD=rm bash run.sh` after a first run trains only the new PPO).
set -euo pipefail
cd "$(dirname "$0")/../.."

OUT=${OUT:-runs/pipeline}
RL_STEPS=${RL_STEPS:-300}
SFT_STEPS=${SFT_STEPS:-300}
RM_STEPS=${RM_STEPS:-150}
SAMPLES=${SAMPLES:-4}
EVAL_TASKS=${EVAL_TASKS:-128}
REWARD=${REWARD:-env+rm}
if [[ -z "${PYTHON:-}" ]]; then
  if [[ -x .venv/bin/python ]]; then PYTHON=.venv/bin/python; else PYTHON=python; fi
fi
export VLLM_LOGGING_LEVEL=${VLLM_LOGGING_LEVEL:-ERROR}
FRESH=${FRESH:-0}
mkdir -p "$OUT/.stages"
TIMES="$OUT/times.txt"
: > "$TIMES"

source examples/pipeline/stages.sh  # stage NAME OUTPUT COMMAND...: run it, or reuse it when it already ran
CODE_KEY=$(code_key agentrl envs rewards)  # the code every stage imports: edited, every stage runs again

# 0. datasets (demos.jsonl, pairs.jsonl, ...) and the untrained default model (tokenizer + random weights)
stage data "$OUT/data" "$PYTHON" examples/pipeline/make_data.py --out "$OUT/data"
BASE=$("$PYTHON" -m agentrl.models prepare default --sft-steps 0)  # prints the folder only (logs: stderr)
echo "untrained default model: $BASE" >&2

# 1. SFT on the teacher's demonstrations: the settings of the default model's own warm start
#    (300 steps of 64, lr 2e-3, 30 warmup steps, cosine to 0), 2 % of the rows held out for the eval loss.
stage sft "$OUT/sft" "$PYTHON" -m agentrl.sft --model "$BASE" --dataset "$OUT/data/demos.jsonl" --messages_key messages \
  --out "$OUT/sft" --max_steps "$SFT_STEPS" --epochs 10 --batch_size 64 --micro_batch_size 64 --lr 2e-3 \
  --warmup_steps $((SFT_STEPS / 10)) --scheduler cosine --min_lr_ratio 0 --eval_fraction 0.02
stage eval_sft "$OUT/eval_sft.json" "$PYTHON" -m agentrl.eval --config examples/agents/guess_number.yaml --model "$OUT/sft" \
  --samples "$SAMPLES" --json "$OUT/eval_sft.json" data.eval_tasks="$EVAL_TASKS"

# 2. Reward model from the SFT model on the preference pairs (Bradley-Terry; 5 % held out).
stage rm "$OUT/rm" "$PYTHON" -m agentrl.rm --model "$OUT/sft" --dataset "$OUT/data/pairs.jsonl" --out "$OUT/rm" \
  --max_steps "$RM_STEPS" --epochs 10 --batch_size 32 --micro_batch_size 32 --lr 1e-3 --warmup_steps 15 \
  --scheduler cosine --min_lr_ratio 0.1 --eval_fraction 0.05 --eval_every 50

# 3. PPO (GAE) from the SFT model: the reward model is a reward source and the critic starts from it.
#    Each REWARD trains into its own folder (ppo, ppo_rm), so one run does not overwrite the other's.
case "$REWARD" in
  env+rm) PPO=ppo; SOURCES="[{name: env, type: env}, {name: rm, type: reward_model, weight: 0.1, reward_model: {path: $OUT/rm}}]" ;;
  rm) PPO=ppo_rm; SOURCES="[{name: rm, type: reward_model, reward_model: {path: $OUT/rm}}]" ;;
  *) echo "REWARD must be env+rm or rm, got $REWARD" >&2; exit 2 ;;
esac
stage "$PPO" "$OUT/$PPO" "$PYTHON" -m agentrl.train --config examples/pipeline/ppo.yaml model.path="$OUT/sft" \
  "rewards.sources=$SOURCES" train.steps="$RL_STEPS" train.out_dir="$OUT/$PPO" data.eval_tasks="$EVAL_TASKS"
stage "eval_$PPO" "$OUT/eval_$PPO.json" "$PYTHON" -m agentrl.eval --config examples/agents/guess_number.yaml --model "$OUT/$PPO/model" \
  --samples "$SAMPLES" --json "$OUT/eval_$PPO.json" data.eval_tasks="$EVAL_TASKS"

# Summary: the env's held-out score (success within 4 guesses) before and after RL, and the times.
"$PYTHON" - "$OUT" "$PPO" "$REWARD" <<'EOF'
import json, sys
from pathlib import Path
out, name, reward = Path(sys.argv[1]), sys.argv[2], sys.argv[3]
times = dict(line.split() for line in (out / "times.txt").read_text().splitlines())
sft = json.loads((out / "sft" / "summary.json").read_text())
rm = json.loads((out / "rm" / "summary.json").read_text())
ppo = json.loads((out / name / "summary.json").read_text())
ev = json.loads((out / "eval_sft.json").read_text())
print("\n=== pipeline summary (held-out: %s tasks x %s samples, env reward) ===" % (ev["tasks"], ev["samples"]))
print(f"SFT  {sft['steps']} steps, {times['sft']} s: held-out loss {sft['evals'][0]['eval/loss']:.3f} -> {sft['evals'][-1]['eval/loss']:.3f}")
e = rm["evals"][-1]
print(f"RM   {rm['steps']} steps, {times['rm']} s: held-out pair accuracy {e['eval/accuracy']:.3f}, margin {e['eval/margin']:.3f}")
b, a = ppo["eval_before"], ppo["eval_after"]
print(f"PPO  ({reward}) {ppo['config']['train']['steps']} steps, {times[name]} s ({ppo['train']['seconds']:.0f} s training): "
      f"in-run held-out (1 sample/task) reward {b['score']:.3f} -> {a['score']:.3f}, "
      f"env success {b['success_rate']:.3f} -> {a['success_rate']:.3f}")
for stage in ("sft", name):
    r = json.loads((out / f"eval_{stage}.json").read_text())
    pk = "  ".join(f"pass@{k} {v:.3f}" for k, v in r["pass_at_k"].items())
    print(f"eval {stage:<6} score {r['score']:.3f}  success {r['success_rate']:.3f}  {pk}  ({times['eval_' + stage]} s)")
print("total " + str(sum(int(v) for v in times.values())) + " s")
EOF
