"""The distillation teacher's start-up checks (algo.teacher): its folder resolved like model.path, and its
tokenizer the student's. The teacher scores the student's token ids as they are, so a teacher with another
vocabulary would score other text (and fail on ids it lacks)."""

from __future__ import annotations

from agentrl.config import ConfigError


def tokenizer_difference(student, teacher) -> str | None:
    """What differs between two tokenizers, in a few words, or None: the vocabulary (token -> id, the added
    tokens among them) and the special tokens the chat template writes and the ledger ends turns with."""
    s_vocab, t_vocab = student.get_vocab(), teacher.get_vocab()
    if s_vocab != t_vocab:
        only_s, only_t = len(s_vocab.keys() - t_vocab.keys()), len(t_vocab.keys() - s_vocab.keys())
        moved = sum(1 for k, v in s_vocab.items() if k in t_vocab and t_vocab[k] != v)
        return (f"vocabularies differ ({len(s_vocab)} vs {len(t_vocab)} tokens: {only_s} only the student's, "
                f"{only_t} only the teacher's, {moved} with other ids)")
    for name in ("eos_token", "bos_token", "pad_token"):
        if getattr(student, name, None) != getattr(teacher, name, None):
            return f"{name} differs ({getattr(student, name, None)!r} vs {getattr(teacher, name, None)!r})"
    if sorted(student.all_special_tokens) != sorted(teacher.all_special_tokens):
        return (f"special tokens differ ({sorted(student.all_special_tokens)} vs "
                f"{sorted(teacher.all_special_tokens)})")
    return None


def resolve_teacher(cfg, student_path: str, student_tokenizer) -> str | None:
    """algo.teacher.model's folder (a named model prepared on first use), checked: it exists offline and its
    tokenizer is the student's. None without a teacher. ConfigError naming both models otherwise."""
    teacher = cfg.algo.teacher
    if teacher is None:
        return None
    from pathlib import Path

    from agentrl.data.chat import load_tokenizer
    from agentrl.models.named import is_hub_id, is_named, resolve_path

    if not (is_named(teacher.model) or Path(teacher.model).expanduser().is_dir() or is_hub_id(teacher.model)):
        raise ConfigError(f"algo.teacher.model={teacher.model!r}: no such folder (a Hugging Face model folder, a hub "
                          "id in the local cache or a named model: python -m agentrl.models list)")
    folder = Path(teacher.model).expanduser()
    path = str(folder) if folder.is_dir() else resolve_path(teacher.model, cfg.model.default)
    try:
        tokenizer = load_tokenizer(path)
    except (OSError, ValueError) as exc:
        raise ConfigError(f"algo.teacher.model={teacher.model!r}: its tokenizer does not load ({exc})") from None
    diff = tokenizer_difference(student_tokenizer, tokenizer)
    if diff is not None:
        student = cfg.model.path or f"the embedded default ({student_path})"
        raise ConfigError(f"algo.teacher.model={teacher.model!r} does not share the student's tokenizer "
                          f"(model.path={student!r}): {diff}. The teacher scores the student's token ids, so both "
                          "must use one tokenizer: pick a teacher of the student's family")
    return path
