"""The config tree: one pydantic model per stage, in data-flow order; every field documented and bounded.

Reward sources are a typed union in `agentrl.config.sources`, the `algo` section and its typed
sub-configs are in `agentrl.config.algo`. Registry names (advantage estimators,
policy losses, tool parsers) are checked against the registries of `agentrl.algo` and
`agentrl.rollout.tools`, imported inside the validators: both are leaves that import nothing of the project
above them. Loading YAML and the nearest-key errors are in `agentrl.config.load`.
"""

from __future__ import annotations

import re
from typing import Any, Literal

from pydantic import ConfigDict, Field, field_validator, model_validator

from agentrl.config.algo import AlgoConfig
from agentrl.config.rollouts import SaveRolloutsConfig
from agentrl.config.sources import RewardsConfig
from agentrl.config.secrets import HOW_TO_GIVE, Secret
from agentrl.config.tools import ToolsConfig
from agentrl.config.base import StrictModel
from agentrl.config.learner import CriticConfig, LearnerConfig

ALLOW_DOWNLOAD = ("let files missing from the local Hugging Face cache be downloaded from the Hub (a hub id's "
                  "model files, datasets an env loads); false (offline, the default): a model file missing from "
                  "the cache is a start-up error naming it, and the run's processes see HF_HUB_OFFLINE=1")
WARM_START_TASKS = ("guess_number", "calculator", "arithmetic")  # envs.<task> has demo_tasks and demonstration


class DefaultModelConfig(StrictModel):
    """The embedded default model, built and warm-started locally when `model.path` is unset."""

    vocab_size: int = Field(384, ge=300, le=65536, description="BPE vocabulary size of the local tokenizer")
    split_digits: bool = Field(False, description="one token per digit (numbers copied from a question into a "
                                                  "tool call then read the same; for arithmetic tasks)")
    hidden_size: int = Field(128, ge=64, le=4096, multiple_of=64, description="width; head_dim is fixed at 64")
    intermediate_size: int = Field(384, ge=64, le=16384, description="MLP width")
    num_layers: int = Field(4, ge=1, le=48, description="transformer layers")
    max_position_embeddings: int = Field(512, ge=64, le=32768, description="context length")
    sft_demos: int = Field(4000, ge=16, le=1_000_000, description="demonstration episodes for the warm start")
    sft_steps: int = Field(300, ge=0, le=100_000, description="supervised optimizer steps")
    sft_batch_size: int = Field(64, ge=1, le=4096, description="demonstrations per SFT step")
    sft_lr: float = Field(2e-3, gt=0, le=1.0, description="peak SFT learning rate (10 % warmup, then cosine decay to 0)")
    task: str = Field(
        "guess_number", description="whose demonstrations train the tokenizer and the warm start: a built-in env "
                    "(guess_number, calculator, arithmetic: envs.<task>), a module of yours, dotted "
                    "(e.g. examples.agents.custom_env, importable from the folder the command runs in), or a .py "
                    "file; it defines demo_tasks(n, seed, split) and demonstration(task, rng, optimal_prob), "
                    "plus a max_turns keyword when demo_max_turns is set")

    @field_validator("task")
    @classmethod
    def _known_task(cls, v: str) -> str:
        if (v not in WARM_START_TASKS and not re.fullmatch(r"[A-Za-z_]\w*(\.[A-Za-z_]\w*)+", v)
                and not v.endswith(".py")):
            raise ValueError(f"{v!r} is neither a built-in warm-start task ({', '.join(WARM_START_TASKS)}), a "
                             "dotted module path (my_pkg.my_env) nor a .py file")
        return v
    demo_optimal_prob: float | None = Field(
        None, ge=0.0, le=1.0, description="chance a demonstration step is the teacher's best play (guess_number: "
        "the bisection midpoint; calculator: a correctly copied tool call); None = the task's own: its module's "
        "DEMO_OPTIMAL_PROB (the built-ins: 0.3), else 0.5. Too weak a teacher leaves the model unable to learn: "
        "min_start_reward stops such a run after its first held-out eval")
    demo_max_turns: int | None = Field(
        None, ge=1, le=1000, description="turns a demonstration may take before it stops (passed to the task's "
        "demonstration(task, rng, optimal_prob, max_turns=...)); None = the task's own (guess_number: 4). An env "
        "run with more turns than its warm start saw plays the later turns out of distribution")
    min_start_reward: float | None = Field(
        0.15, description="the run stops after its held-out eval before RL when the warm-started model scores a "
        "mean reward below this, naming what to change (demo_optimal_prob, sft_steps, the demonstration): from "
        "0.104 a newcomer's task gained +0.010 in 60 steps. The shipped tasks start at 0.2-0.53. None: no check")
    seed: int = Field(0, ge=0, description="seed for weights, tokenizer corpus and demonstrations")
    cache_dir: str | None = Field(None, description="where built models are cached (default $AGENTRL_CACHE "
                                                    "or ~/.cache/agentrl)")


class ModelConfig(StrictModel):
    """The policy: a Hugging Face folder, or the embedded default built locally."""

    path: str | None = Field(None, description="Hugging Face model folder, a hub id (org/name) whose files are all "
                                               "in the local Hugging Face cache, or a named model prepared offline "
                                               "(`python -m agentrl.models list`); unset = the embedded default")
    allow_download: bool = Field(False, description=ALLOW_DOWNLOAD)
    default: DefaultModelConfig = Field(default_factory=DefaultModelConfig,
                                        description="settings of the embedded default (used when path is unset)")


class EnvConfig(StrictModel):
    """The environment: an Env subclass loaded by import path."""

    import_path: str = Field("envs.guess_number:GuessNumberEnv", description="'package.module:Class' of the Env")
    kwargs: dict[str, Any] = Field(default_factory=dict, description="keyword arguments for the Env constructor")


class DataConfig(StrictModel):
    """Where tasks come from."""

    train_path: str | None = Field(None, description="jsonl of training tasks; unset = Env.make_tasks")
    eval_path: str | None = Field(None, description="jsonl of held-out tasks; unset = Env.make_tasks")
    train_tasks: int = Field(100_000, ge=1, description="tasks to generate when train_path is unset")
    eval_tasks: int = Field(128, ge=1, description="held-out tasks to generate when eval_path is unset")
    task_kwargs: dict[str, Any] = Field(default_factory=dict, description="extra arguments for Env.make_tasks")
    seed: int = Field(0, ge=0, description="seed for task generation and shuffling")


class EngineConfig(StrictModel):
    """The vLLM AsyncLLM engine."""

    dtype: Literal["float32", "bfloat16", "float16", "auto"] = Field(
        "float32", description="vLLM weights dtype; float32 keeps vLLM and learner logprobs within 1e-4")
    max_model_len: int = Field(512, ge=32, le=131072, description="longest episode in tokens")
    kv_cache_memory_bytes: int = Field(256 * 2**20, ge=2**20, description="KV cache size in bytes")
    max_num_seqs: int = Field(128, ge=1, le=4096, description="sequences vLLM batches at once")
    max_num_batched_tokens: int = Field(8192, ge=32, description="tokens per engine step (>= max_model_len)")
    seed: int = Field(0, ge=0, description="engine sampling seed")
    enforce_eager: bool = Field(True, description="skip graph capture/compilation (faster start on CPU)")
    block_size: int | None = Field(None, ge=16, le=1024, description="tokens per KV-cache block; prefix caching "
                                   "reuses whole blocks only (None: 32 on CPU, a multiple of 32 there; vLLM's choice on GPU)")


class RolloutConfig(StrictModel):
    """How episodes are sampled."""

    n_samples: int = Field(8, ge=1, le=1024, description="episodes per task (group size for group baselines)")
    temperature: float = Field(1.0, ge=1e-5, le=5.0, description="sampling temperature (vLLM samples greedily "
                               "below 1e-5 and would report logprobs at temperature 1, which the learner cannot match)")
    top_p: float = Field(1.0, gt=0.0, le=1.0, description="nucleus sampling")
    max_tokens_per_turn: int = Field(16, ge=1, le=32768, description="generation cap per model turn")
    max_turns: int = Field(16, ge=1, le=1000, description="hard cap on model turns per episode")
    max_concurrency: int = Field(64, ge=1, le=100_000, description="episodes in flight at once")
    episode_timeout_s: float = Field(120.0, gt=0, description="deadline for a whole episode")
    turn_timeout_s: float = Field(30.0, gt=0, description="deadline for one generate call or one env step")
    fail_after: int = Field(128, ge=0, description="end the run (exit 1, with the first failure's traceback) when "
                            "this many episodes in a row fail (env_error, timeout, engine_error, reward_error) with "
                            "none finishing; at least max_concurrency + 1 count, since one engine death fails every "
                            "episode in flight on it; 0 = never")
    tool_format: str = Field("hermes", description="the model's tool-call format, a name in agentrl.rollout.tools."
                             "TOOL_FORMATS: rollout and the OpenAI endpoint parse, render and cut tool calls with "
                             "it; 'pkg.module:name' imports pkg.module first")

    @field_validator("tool_format")
    @classmethod
    def _known_parser(cls, name: str) -> str:
        from agentrl.rollout.tools import get_tool_format

        get_tool_format(name)  # ValueError naming the registered parsers, or the module it cannot import
        return name


class BufferConfig(StrictModel):
    """Batch assembly and the staleness bound."""

    batch_size: int = Field(64, ge=1, le=1_000_000, description="episodes per learner batch (multiple of n_samples)")
    max_staleness: int = Field(1, ge=0, le=1000,
                               description="max learner version minus oldest token version; 0 = on-policy. A version is "
                               "one optimizer step (learner.mini_batches of them a batch)")
    max_ahead_batches: int | None = Field(
        2, ge=1, le=1000, description="batches generation may run ahead of the learner (groups admitted and not "
        "yet trained <= this many batches); None = as far as max_staleness allows. When generation outruns the "
        "learner, the bound alone makes nearly every token max_staleness old; this keeps the bulk fresh while the "
        "bound still admits stragglers. 2 never binds at max_staleness 0 or 1 (docs/benchmarks.md, Staleness)")


class WeightSyncConfig(StrictModel):
    """Weight pushes from the learner to the engine."""

    every_steps: int = Field(1, ge=1, description="push weights to the engine every k optimizer steps")
    deadline_s: float = Field(60.0, gt=0, description="a push that takes longer is reported as failed")
    handover_dir: str | None = Field(None, description="folder of the weight files handed to the engine "
                                                       "(default /dev/shm when it has room, else the temp folder)")
    transport: Literal["auto", "collective", "file"] = Field(
        "auto", description="collective: broadcast through a torch.distributed group (gloo on CPU, NCCL on GPU) "
                            "into each engine's workers; file: a safetensors file per push (Ray: via the object "
                            "store); auto: collective when every engine joins its group at start-up, else file")
    bucket_mb: int = Field(64, ge=1, le=16384, description="collective: tensors travel packed in buffers of at "
                                                          "most this many MiB (bounds the receiver's extra memory)")


class ClusterConfig(StrictModel):
    """Where the engines and learner ranks run: this process (local) or Ray actors on one or many nodes.

    Multi-node: `ray start --head` on one node, `ray start --address=HEAD:6379` on the others, then run
    with `cluster.backend=ray cluster.address=auto` on any of them."""

    backend: Literal["local", "ray"] = Field("local", description="local: engines and one learner rank in this "
                                                                  "process; ray: each engine and rank a Ray actor")
    address: str | None = Field(None, description="ray: unset starts a local Ray; 'auto' joins the running "
                                                  "cluster; or 'host:port' of its head")
    engines: int = Field(1, ge=1, le=1024, description="vLLM engines; an episode stays on one for all its turns")
    engine_num_cpus: float = Field(1.0, ge=0, le=1024, description="ray: CPUs reserved for each engine actor")
    engine_num_gpus: float = Field(0.0, ge=0, le=64, description="ray: GPUs for each engine actor "
                                                                  "(tensor_parallel_size of them when > 0)")
    tensor_parallel_size: int = Field(1, ge=1, le=64, description="GPUs one engine shards its model across")
    learner_ranks: int = Field(1, ge=1, le=4096, description="DeepSpeed data-parallel ranks (ray backend when > 1)")
    learner_num_cpus: float = Field(1.0, ge=0, le=1024, description="ray: CPUs reserved for each learner rank")
    learner_num_gpus: float = Field(0.0, ge=0, le=8, description="ray: GPUs for each learner rank (nccl when > 0)")
    colocate: bool = Field(True, description="ray: engines may share nodes with learner ranks; false places "
                                             "engines only on nodes that hold no learner rank")
    max_engine_restarts: int = Field(3, ge=0, le=1000, description="restarts per engine after it dies; one more "
                                                                   "death ends the run with an error")
    start_timeout_s: float = Field(600.0, gt=0, description="deadline for an engine or learner rank to start")
    engine_resources: dict[str, float] = Field(default_factory=dict, description="ray: custom resources each "
                                               "engine actor asks for, to place engines on the nodes that offer "
                                               "them (`ray start --resources='{\"engine_node\": 2}'`)")
    learner_resources: dict[str, float] = Field(default_factory=dict, description="ray: custom resources each "
                                                "learner rank asks for, to place ranks on the nodes that offer them")
    bind_host: str = Field("127.0.0.1", min_length=1, description="ray: the address a local Ray (no cluster.address) "
                           "listens on; loopback unless told otherwise")
    interface: str = Field("", pattern=r"^[A-Za-z0-9_.:-]{0,15}$", description="ray, several nodes: the network "
                           "interface the nodes reach each other on (e.g. eth1): the learner ranks' rendezvous, "
                           "the weight groups and gloo/NCCL listen on it; '' = the ranks' rendezvous and the weight "
                           "hub on the address Ray knows each node by, gloo/NCCL on their own choice (a local Ray of "
                           "the run's own: loopback)")


class TrainConfig(StrictModel):
    """The training loop and its outputs."""

    steps: int = Field(400, ge=0, le=10_000_000, description="learner batches to train on")
    eval_before: bool = Field(True, description="evaluate the starting model on the held-out tasks")
    eval_after: bool = Field(True, description="evaluate the trained model on the held-out tasks")
    eval_every: int = Field(0, ge=0, description="also evaluate every N steps during training (0 = never)")
    out_dir: str = Field("runs/default", description="metrics.jsonl, summary.json and the saved model go here")
    save_model: bool = Field(True, description="save the trained model as a Hugging Face folder")
    seed: int = Field(0, ge=0, description="learner seed")
    checkpoint_every: int = Field(100, ge=0, description="write a resumable checkpoint under "
                                  "<out_dir>/checkpoints/step_N every N learner steps and at the end (0 = none on "
                                  "a schedule; SIGTERM/SIGINT still write one)")
    checkpoint_keep: int = Field(2, ge=0, description="complete checkpoints kept on disk, newest first (0 = all)")
    resume: str | None = Field(None, description="'auto' (the newest complete checkpoint in out_dir, or a fresh "
                                                 "start when there is none) or a checkpoint folder; another run's checkpoint is "
                                                 "only read, a rollback within out_dir moves the later "
                                                 "checkpoints to checkpoints/abandoned-<time>/")
    loggers: list[Literal["jsonl", "tensorboard", "wandb"]] = Field(
        default_factory=lambda: ["jsonl"], description="metric sinks; metrics.jsonl is always written (resume "
                                                       "and the end-of-run plot read it)")
    wandb_project: str = Field("agentrl", description="wandb project (offline unless WANDB_MODE or an API key "
                                                      "says otherwise)")
    save_rollouts: SaveRolloutsConfig = Field(
        default_factory=SaveRolloutsConfig, description="trained episodes kept in <out_dir>/rollouts.jsonl "
        "(messages, tokens and their text, masks, logprobs, versions, reward, status) for `python -m agentrl.view` "
        "and `agentrl.replay`: a sample of each step's groups, up to a cap on disk; true = every episode, no cap; "
        "false = none")


class ServerConfig(StrictModel):
    """The OpenAI-compatible endpoint (agentrl.rollout.openai_server): started by runs whose env is an
    AgentEnv (each episode gets its own session URL) and by `python -m agentrl.serve`."""

    model_config = ConfigDict(**StrictModel.model_config, hide_input_in_errors=True)  # an error never quotes the key
    host: str = Field("127.0.0.1", description="bind address; loopback unless told otherwise (0.0.0.0 = every interface)")
    port: int = Field(0, ge=0, le=65535, description="TCP port; 0 = any free port (what training runs use)")
    api_key: Secret | None = Field(None, description=f"bearer token every request must carry; unset = no "
                                   f"authentication. Give {HOW_TO_GIVE}; the value itself only in a YAML file "
                                   f"(warned about when others can read the file), never on the command line "
                                   f"(ps shows it). Written out as ********** everywhere")
    allow_hosts: list[str] = Field(default_factory=list, description="Host names answered besides the bound "
                                   "address's own (127.0.0.1 / localhost / [::1] on loopback); any other Host is a "
                                   "403, so a web page re-pointed here by DNS rebinding is refused")
    model_name: str = Field("agentrl", min_length=1, description="the model id /v1/models lists and responses name")
    # Memory is bounded by max_sessions x session_max_tokens (about 100 bytes a ledger token), so both are finite.
    max_sessions: int = Field(4096, ge=1, description="sessions clients may hold open at once over HTTP (POST "
                              "/sessions); more is a 429 (too_many_sessions); idle ones expire. Training "
                              "episodes' sessions are bounded by rollout.max_concurrency instead")
    session_idle_timeout_s: float = Field(600.0, gt=0, le=604_800, description="a session opened over HTTP (POST "
                                          "/sessions, agentrl.serve) with no request for this long is closed and its "
                                          "ledger dropped (swept every quarter of it, at most 30 s); a training "
                                          "episode's session ends with its episode")
    session_max_turns: int = Field(1000, ge=1, description="model turns one HTTP-opened session may take; more is a "
                                   "400 (context_length_exceeded): open a new session")
    session_max_tokens: int = Field(262_144, ge=1, description="tokens one HTTP-opened session's ledger may hold over "
                                    "all its segments; more is a 400 (context_length_exceeded)")
    generation_timeout_s: float = Field(600.0, gt=0, description="deadline of one generation when the rollout sets "
                                        "none (agentrl.serve; training uses rollout.turn_timeout_s); past it the "
                                        "request is a 504 and the generation is cancelled")


class Config(StrictModel):
    """The whole run: one section per stage, in data-flow order."""

    model: ModelConfig = Field(default_factory=ModelConfig, description="which model to train")
    env: EnvConfig = Field(default_factory=EnvConfig, description="the environment class and its arguments")
    data: DataConfig = Field(default_factory=DataConfig, description="training and held-out tasks")
    engine: EngineConfig = Field(default_factory=EngineConfig, description="the vLLM rollout engine")
    rollout: RolloutConfig = Field(default_factory=RolloutConfig, description="episode sampling and deadlines")
    server: ServerConfig = Field(default_factory=ServerConfig, description="the OpenAI endpoint AgentEnv agents call")
    tools: ToolsConfig = Field(default_factory=ToolsConfig, description="tool servers envs call, by name")
    rewards: RewardsConfig = Field(default_factory=RewardsConfig, description="reward sources and failure policy")
    buffer: BufferConfig = Field(default_factory=BufferConfig, description="batching and the staleness bound")
    algo: AlgoConfig = Field(default_factory=AlgoConfig, description="advantages, loss, off-policy correction")
    learner: LearnerConfig = Field(default_factory=LearnerConfig, description="the DeepSpeed actor")
    critic: CriticConfig = Field(default_factory=CriticConfig, description="the value model (algo.advantage.type gae)")
    weight_sync: WeightSyncConfig = Field(default_factory=WeightSyncConfig, description="learner -> engine pushes")
    cluster: ClusterConfig = Field(default_factory=ClusterConfig, description="local or Ray engines and ranks")
    train: TrainConfig = Field(default_factory=TrainConfig, description="loop length, evals and outputs")

    @model_validator(mode="after")
    def _consistent(self) -> "Config":
        if self.buffer.batch_size % self.rollout.n_samples:
            raise ValueError(f"buffer.batch_size={self.buffer.batch_size} must be a multiple of "
                             f"rollout.n_samples={self.rollout.n_samples} (whole groups per batch)")
        if self.algo.advantage.type == "gae" and self.critic.init_from == "reward_model" and not any(
                s.type == "reward_model" for s in self.rewards.sources):
            raise ValueError("critic.init_from=reward_model needs a rewards source of type reward_model")
        named = self.env.kwargs.get("tool_server")
        if named is not None and (not isinstance(named, str) or named not in self.tools.servers):
            raise ValueError(f"env.kwargs.tool_server={named!r} is not a server of tools.servers "
                             f"({sorted(self.tools.servers) or 'none configured'})")
        c = self.cluster
        if c.engine_num_gpus > 0 and c.tensor_parallel_size > 1 and c.engine_num_gpus != c.tensor_parallel_size:
            # vLLM starts its tensor-parallel workers inside the actor, on the GPUs Ray gave the actor.
            raise ValueError(f"cluster.engine_num_gpus={c.engine_num_gpus:g} must equal cluster.tensor_parallel_size="
                             f"{c.tensor_parallel_size} (each engine actor holds the GPUs of all its workers)")
        if c.learner_num_gpus not in (0, 1):
            raise ValueError(f"cluster.learner_num_gpus={c.learner_num_gpus:g} must be 0 or 1 (one GPU per "
                             f"DeepSpeed rank; more ranks for more GPUs)")
        ranks = self.cluster.learner_ranks
        if ranks > 1 and self.cluster.backend != "ray":
            raise ValueError(f"cluster.learner_ranks={ranks} needs cluster.backend=ray")
        if ranks > 1 and self.buffer.batch_size % (ranks * self.learner.mini_batches):
            # Every rank takes an equal share of each mini-batch: ZeRO-3 ranks must run the same
            # number of forward passes, and all-gathers need equal shapes.
            raise ValueError(f"buffer.batch_size={self.buffer.batch_size} must be a multiple of cluster.learner_ranks"
                             f" * learner.mini_batches = {ranks * self.learner.mini_batches}")
        return self


