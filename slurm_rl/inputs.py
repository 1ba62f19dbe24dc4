"""What a config names, checked before anything is launched: model, tokenizer, data, reward files,
and whether the scheduling policy can start from the placement.

:func:`load_config` checks keys and values; :func:`input_problems` opens what they point at
(``model.path``'s config.json and safetensors headers, the tokenizer, every data file, the reward
function's module) and tokenises the training prompts once, so that a missing tensor, a data file
without ``prompt_key``, or no prompt left after ``data.max_prompt_length`` stops ``slurm-rl
validate`` / ``run`` / ``submit`` / ``sbatch`` with exit code 2 and every problem at once.
Emulated runs read none of these files; they check that the files exist (``runtime.check_files``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from slurm_rl.config import Config, ConfigError, ConfigIssue, actor_offloads, actor_tp_choices, tp_shape_problems


def input_problems(cfg: Config) -> list[ConfigIssue]:
    """Every problem of the model, tokenizer, data and reward of a real-engine config; of an emulated one, the
    files it names that do not exist; of both, the trackers that are not installed."""
    from slurm_rl.config_warnings import emulated_file_problems, tracker_problems

    if cfg.runtime.device == "emulated":
        return emulated_file_problems(cfg) + tracker_problems(cfg)
    issues: list[ConfigIssue] = tracker_problems(cfg)
    m = cfg.model
    if m.path is not None:
        from slurm_rl.engines.hf_checkpoint import checkpoint_problems

        issues += [ConfigIssue(*p) for p in checkpoint_problems(m.path, "model.path", m.tokenizer_path)]
    tok = None
    if m.tokenizer_path is not None and not Path(m.tokenizer_path).is_dir():
        issues.append(ConfigIssue("model.tokenizer_path", m.tokenizer_path, "an existing tokenizer directory"))
    elif not any(i.key == "model.path" and "tokenizer" in str(i.allowed) for i in issues):
        tok = _tokenizer(cfg, issues)
    from slurm_rl.rl.dataset import check_data_files

    from slurm_rl.worker.real_compute import data_spec

    spec = data_spec(cfg)
    data_issues = [ConfigIssue(*p) for p in check_data_files(cfg.data.train_files, "data.train_files", spec)]
    data_issues += [ConfigIssue(*p) for p in check_data_files(cfg.data.val_files, "data.val_files", spec)]
    issues += data_issues
    if not any(i.key in ("model.path", "model.tokenizer_path") for i in issues):
        issues += tp_model_problems(cfg, tok)
        issues += rollout_model_problems(cfg)
    dataset = None
    if tok is not None and not data_issues:
        prompt_issues, dataset = _prompt_problems(cfg, spec, tok)
        issues += prompt_issues
    from slurm_rl.rewards import reward_problems

    reward_issues = [ConfigIssue(*p) for p in reward_problems(cfg.reward.name, cfg.reward.fn)]
    issues += reward_issues
    if dataset is not None and not reward_issues:
        issues += ground_truth_problems(cfg, dataset)
    return issues


GROUND_TRUTH_ROWS = 3
"""How many rows ``validate`` scores with their own ground truth before a launch."""


def ground_truth_problems(cfg: Config, dataset: Any) -> list[ConfigIssue]:
    """Score the first rows' ground truth as a response with the configured reward: when it raises
    ``ValueError`` on every one of them (an answer the reward cannot read, e.g. ``data.answer_key``
    naming a mapping instead of the text inside it), the run is refused before launch instead of
    failing on its first sample. A reward that refuses only some rows (on purpose) passes."""
    from slurm_rl.rewards import resolve_reward

    reward = resolve_reward(cfg.reward.name, cfg.reward.fn)
    errors = []
    rows = dataset.rows[:GROUND_TRUTH_ROWS]
    for row in rows:
        try:
            reward(row.raw_prompt, str(row.answer), row.answer, dict(row.extra))
        except ValueError as err:
            errors.append(f"{row.source}: {err}")
    if rows and len(errors) == len(rows):
        return [ConfigIssue("data.answer_key", cfg.data.answer_key, (
            f"a column whose values the reward {cfg.reward.name or cfg.reward.fn} can score; {errors[0]}"))]
    return []


def tp_model_problems(cfg: Config, tok: Any) -> list[ConfigIssue]:
    """Whether the actor's model splits over every tensor-parallel size it may take (and a critic with
    ranks of its own over ``critic.tensor_parallel``): the sizes of ``model.path``'s config.json, or of a
    random model whose vocabulary is the tokenizer's (``load_config`` checks a random model's own sizes)."""
    m = cfg.model
    sizes_of = {tp: ("actor.tensor_parallel" if tp == cfg.actor.tensor_parallel else "actor.tensor_parallel_choices")
                for tp in actor_tp_choices(cfg)}
    wanted = [(key, tp) for tp, key in sizes_of.items() if tp > 1]
    if (cfg.critic.tensor_parallel or 1) > 1:
        wanted.append(("critic.tensor_parallel", cfg.critic.tensor_parallel))
    if not wanted or (m.path is None and m.vocab_size is not None):
        return []
    from slurm_rl.worker.real_compute import engine_model_config

    if m.path is None and m.tokenizer_path is not None:
        if tok is None:
            return []  # the tokenizer's own problem is reported
        vocab = len(tok)
    else:
        from slurm_rl.rl.tokenizer import CharTokenizer

        vocab = CharTokenizer().vocab_size
    try:
        mc = engine_model_config(cfg, vocab)
    except Exception:  # a checkpoint transformers cannot read: checkpoint_problems reports it
        return []
    sizes = {"vocab_size": mc.vocab_size, "num_attention_heads": mc.num_attention_heads,
             "num_query_groups": mc.kv_groups if mc.kv_groups != mc.num_attention_heads else None, "ffn_hidden_size": mc.ffn_size, "hidden_size": mc.hidden_size}
    where = f"{m.path}/config.json" if m.path is not None else f"the tokenizer's vocabulary of {vocab}"
    out = []
    for key, tp in wanted:
        problems = tp_shape_problems(sizes, tp)
        if problems:
            out.append(ConfigIssue(key, tp, (
                "a tensor-parallel size that divides the model's attention heads, query groups, FFN and "
                f"vocabulary ({where}: {'; '.join(problems)})")))
    return out


def model_context(cfg: Config) -> int:
    """The model's context in tokens (``max_position_embeddings``: ``model.path``'s config.json, else the
    random model's)."""
    if cfg.model.path is None:
        from slurm_rl.config import model_sizes

        return int(model_sizes(cfg.model)["max_position_embeddings"])
    from slurm_rl.engines.hf_checkpoint import model_config_from_dir

    return int(model_config_from_dir(cfg.model.path).max_position_embeddings)


def rollout_model_problems(cfg: Config) -> list[ConfigIssue]:
    """The rollout engine's options against ``model.path``'s config.json: its context holds a prompt and
    its response, ``rollout.max_model_len`` fits in it, the engine's TP size splits its attention
    (``load_config`` checks a random model's own sizes)."""
    if cfg.model.path is None:
        return []
    from slurm_rl.engines.hf_checkpoint import model_config_from_dir
    from slurm_rl.rollout_config import rollout_engine_problems

    try:
        mc = model_config_from_dir(cfg.model.path)
    except Exception:  # a checkpoint transformers cannot read: checkpoint_problems reports it
        return []
    sizes = {"max_position_embeddings": mc.max_position_embeddings, "num_attention_heads": mc.num_attention_heads,
             "num_query_groups": mc.kv_groups}
    return rollout_engine_problems(cfg.rollout, backend_vllm=cfg.rollout.backend == "vllm",
                                   device=cfg.runtime.device, max_prompt_length=cfg.data.max_prompt_length,
                                   sizes=sizes, where=f"{cfg.model.path}/config.json")


def _tokenizer(cfg: Config, issues: list[ConfigIssue]) -> Any:
    from slurm_rl.rl.tokenizer import load_tokenizer

    m = cfg.model
    if m.path is not None and not Path(m.path).is_dir():
        return None
    try:
        return load_tokenizer(m.path, m.tokenizer_path)
    except Exception as err:  # transformers raises many kinds of errors for a bad tokenizer
        key = "model.tokenizer_path" if m.tokenizer_path else "model.path"
        issues.append(ConfigIssue(key, m.tokenizer_path or m.path, f"a loadable tokenizer (AutoTokenizer: {err})"))
        return None


def _prompt_problems(cfg: Config, spec: Any, tok: Any) -> tuple[list[ConfigIssue], Any]:
    """Tokenise the prompts as the run will: no prompt left, an overlong prompt with
    ``data.overlong: error``, a chat prompt without a template. Also returns the training
    dataset (None when it did not load)."""
    from slurm_rl.errors import InputError
    from slurm_rl.rl.dataset import PromptDataset

    out = []
    train = None
    for key, files in (("data.train_files", cfg.data.train_files), ("data.val_files", cfg.data.val_files)):
        if not files:
            continue
        try:
            loaded = PromptDataset.load(files, spec, tok, key=key)
            train = loaded if key == "data.train_files" else train
        except InputError as err:  # the dataset names its own key: "KEY: got V; allowed: A" per line
            for line in str(err).splitlines():
                head, sep, allowed = line.partition("; allowed: ")
                name, _, value = head.partition(": got ")
                out.append(ConfigIssue(name, _literal(value), allowed) if sep and value
                           else ConfigIssue(key, list(files), line))
    return out, train


def _literal(text: str) -> Any:
    """The value a message printed with ``repr`` (the text itself when it is not a literal)."""
    import ast

    try:
        return ast.literal_eval(text)
    except (ValueError, SyntaxError):
        return text


def schedule_problems(cfg: Config) -> list[ConfigIssue]:
    """The initial placement as the configured policy sees it (the coordinator refuses the same
    placement at its start): e.g. ``auto`` with actor and inference on one rank; and ``plan`` told
    ``scheduler.time_slicing: true`` where it could never run an iteration collocated."""
    from slurm_rl.scheduler.live_state import check_setup

    if cfg.scheduler.policy not in ("auto", "plan"):  # the dynamic policies (as the coordinator checks)
        return []
    try:
        check_setup(cfg)
    except ValueError as err:
        return [ConfigIssue("cluster.component_placement", dict(cfg.raw.cluster.component_placement),
                            str(err).split(": ", 1)[-1])]
    if cfg.scheduler.policy == "plan" and cfg.scheduler.time_slicing is True:
        from slurm_rl.scheduler.live_state import time_slicing_problems

        off = time_slicing_problems(cfg)
        if off:  # insisted on, but plan could never run an iteration collocated
            return [ConfigIssue("scheduler.time_slicing", True,
                                f"false or null here: plan cannot run an iteration collocated ({'; '.join(off)})")]
    return []


def check_inputs(cfg: Config) -> None:
    """Raise :class:`ConfigError` with every problem of :func:`input_problems`, :func:`schedule_problems`
    and, on cuda, whether the phases of ranks that serve several components fit (:mod:`slurm_rl.memory_fit`),
    also those of an iteration ``plan`` may run collocated (exit code 2)."""
    issues = schedule_problems(cfg) + input_problems(cfg)
    if not issues and cfg.runtime.device == "cuda":
        from slurm_rl.memory_fit import memory_problems, time_slicing_memory_problems

        params = model_summary(cfg)["parameters"]
        issues = time_slicing_memory_problems(cfg, params)
        if cfg.placement.mode != "disaggregated":
            issues += memory_problems(cfg, params)
    if issues:
        raise ConfigError(issues)


def time_slicing_off_because(cfg: Config) -> list[str]:
    """Why ``plan`` runs every iteration of ``cfg`` disaggregated (empty: it may run some collocated): the
    policy's rules (``live_state.time_slicing_problems``) and, with ``scheduler.time_slicing`` left null on
    cuda, every component not fitting one GPU (``memory_fit.collocated_overflow``, where a budget is known);
    ``launch.prepare`` writes such a run down with it false."""
    from slurm_rl.memory_fit import collocated_overflow
    from slurm_rl.scheduler.live_state import time_slicing_problems

    off = time_slicing_problems(cfg)
    if off or cfg.scheduler.time_slicing is not None or cfg.runtime.device != "cuda":
        return off
    pm = collocated_overflow(cfg, model_summary(cfg)["parameters"])
    if pm is not None:
        hint = "" if actor_offloads(cfg) else "; actor.offload_weight: true parks the actor between phases"
        return [f"every component on one GPU would need at least {pm.describe()}{hint}"]
    return []


def model_summary(cfg: Config) -> dict[str, Any]:
    """What the run trains, for ``slurm-rl validate``: ``architecture``, ``parameters`` and ``source``
    (the checkpoint directory, a random model of the ``model`` sizes, or the emulated cost model)."""
    import math

    if cfg.runtime.device == "emulated":
        return {"architecture": "none (emulated cost model)", "parameters": int(cfg.emulated.model_params),
                "source": "emulated.model_params"}
    from slurm_rl.engines.convert import hf_param_shapes
    from slurm_rl.worker.real_compute import engine_model_config

    vocab = 0
    if cfg.model.path is None:
        from slurm_rl.rl.tokenizer import CharTokenizer, load_tokenizer

        vocab = len(load_tokenizer(None, cfg.model.tokenizer_path)) if cfg.model.tokenizer_path else CharTokenizer().vocab_size
    model = engine_model_config(cfg, vocab)
    params = sum(math.prod(shape) for _, shape in hf_param_shapes(model))
    return {"architecture": model.architecture, "parameters": int(params),
            "source": cfg.model.path or "random init (model.* sizes, runtime.seed)"}
