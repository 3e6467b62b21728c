"""vLLM engine settings (``vllm serve --config FILE``): the decode batch cap's two knobs.

A vLLM config file holds the server's command-line arguments without the leading dashes
(docs.vllm.ai, "Engine Arguments" and "--config"): ``max-num-seqs`` caps the sequences in one
batch (vLLM's default 256 on most GPUs; ``max_num_seqs`` is read too), ``max-num-batched-tokens``
the tokens one scheduler step takes (the chunked-prefill budget). These two are the batch gate's
actuators (:mod:`tokenfactory.controllers.batch_gate`). Every other key is an engine setting
outside the control plane (model, parallelism, memory): it is kept exactly as written and listed
in :attr:`VLLMSetting.engine_keys`, not modelled.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from tokenfactory.controllers.formats.common import NotModelled
from tokenfactory.core.errors import ConfigError
from tokenfactory.core.validation import check_int

__all__ = ["VLLMSetting", "read_vllm", "CONTROL_KEYS"]

#: the control knobs (dashed form, as the CLI spells them) -> the setting's attribute
CONTROL_KEYS = {"max-num-seqs": "max_num_seqs", "max-num-batched-tokens": "max_num_batched_tokens"}


@dataclass(frozen=True)
class VLLMSetting:
    """The batch cap of a vLLM config file, and which engine keys it also holds.

    Parameters
    ----------
    max_num_seqs : int, optional
        ``max-num-seqs``: the most sequences in one batch (>= 1; default None: not set, vLLM's own
        default applies, 256 on most GPUs).
    max_num_batched_tokens : int, optional
        ``max-num-batched-tokens``: the most tokens one scheduler step takes (>= 1; default None: not set).
    engine_keys : tuple of str
        The file's other keys (engine settings outside the control plane), in file order; not modelled.
    underscored : bool
        Whether the file spells the control keys with underscores (``max_num_seqs``) rather than
        dashes; :meth:`to_documents` writes them the same way (default False).
    """

    max_num_seqs: int | None = None
    max_num_batched_tokens: int | None = None
    engine_keys: tuple[str, ...] = ()
    underscored: bool = False      # the file spells keys max_num_seqs rather than max-num-seqs
    format: str = field(default="vllm", init=False)

    def to_documents(self) -> list[dict]:
        doc = {}
        for key, attr in CONTROL_KEYS.items():
            if getattr(self, attr) is not None:
                doc[key.replace("-", "_") if self.underscored else key] = getattr(self, attr)
        return [doc]

    def flags(self) -> str:
        """The same settings as ``vllm serve`` flags."""
        return " ".join(f"--{k} {getattr(self, a)}" for k, a in CONTROL_KEYS.items() if getattr(self, a) is not None)

    def controller_params(self) -> dict:
        return {"max_num_seqs": self.max_num_seqs, "max_num_batched_tokens": self.max_num_batched_tokens}

    def build(self, pool: str):
        raise NotModelled("vllm", "a vLLM config sets the engine's batch cap, not a pool autoscaler; "
                          "advise it with the batch gate (tokenfactory advise --control-plane FILE)")

    def with_params(self, **changes) -> VLLMSetting:
        out = {}
        for key, value in changes.items():
            attr = CONTROL_KEYS.get(key, key)
            if attr not in CONTROL_KEYS.values():
                raise ConfigError(f"vllm.{key}", "not a knob; knobs: " + ", ".join(CONTROL_KEYS.values()))
            out[attr] = check_int(f"vllm.{attr}", int(value), low=1)
        return replace(self, **out)


def read_vllm(docs: list[dict], where: str = "vllm") -> VLLMSetting:
    """The :class:`VLLMSetting` of a vLLM config document.

    Parameters
    ----------
    docs : list of dict
        The file's parsed YAML documents: exactly one mapping of engine arguments.
    where : str
        Name of the file, the root of every error's path (default ``"vllm"``).

    Raises
    ------
    ConfigError
        When there is not exactly one mapping, or a control key is not an integer >= 1.
    """
    if len(docs) != 1 or not isinstance(docs[0], dict):
        raise ConfigError(where, f"expected one mapping of engine arguments, found {len(docs)} documents")
    values, engine, underscored = {}, [], False
    for key, value in docs[0].items():
        dashed = str(key).replace("_", "-")
        if dashed in CONTROL_KEYS:
            underscored = underscored or "_" in str(key)
            values[CONTROL_KEYS[dashed]] = check_int(f"{where}.{key}", value, low=1)
        else:
            engine.append(str(key))
    return VLLMSetting(**values, engine_keys=tuple(engine), underscored=underscored)
