"""Getting the public traces: where each one comes from, its checksum, and a download that checks it.

Each registered trace (:data:`tokenfactory.traces.TRACES`) has a :class:`TraceSource` here: the
upstream URL pinned to a commit, the licence and citation, and the sha256 of the file the loaders
expect (taken from the shared copies, ``/work/shared/traces/*/SOURCE.md`` in the development setup).
Traces whose file is a byte-for-byte copy of an upstream file download directly
(:func:`fetch_trace`); the derived ones (the flattened agentic sessions, the ServeGen aggregates)
have no file upstream to download, so fetching them fails with the upstream location and how the
file was derived. Files are stored in :func:`fetch_dir`, which the loaders search
(:func:`tokenfactory.traces.trace_path`).
"""

from __future__ import annotations

import hashlib
import os
import tempfile
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from tokenfactory.core.validation import ConfigError

__all__ = ["TraceSource", "TRACE_SOURCES", "FetchError", "fetch_dir", "fetch_trace", "sha256_of"]

_AZURE = "https://raw.githubusercontent.com/Azure/AzurePublicDataset/b469a113cedca53ddc3bdea71a143dc4b7d8700c/data/"
_MOONCAKE = ("https://raw.githubusercontent.com/kvcache-ai/Mooncake/3b5a594133958449a1feaf1c9e0fc1b553e34a28/"
             "FAST25-release/traces/")
_AZURE_LICENCE = ("CC-BY 4.0 (data); attribution: Patel et al., \"Splitwise: Efficient generative LLM inference "
                  "using phase splitting\", ISCA 2024")
_SERVEGEN = ("derived from https://github.com/alibaba/ServeGen (commit f891d1189eb32b3868dfc443800c4150548c282a, "
             "data/*/chunk-<client>-trace.csv): the clients' 10-minute rates summed per window")


@dataclass(frozen=True)
class TraceSource:
    """Where a registered trace comes from.

    Parameters
    ----------
    name : str
        The registered trace name.
    url : str or None
        The upstream file, pinned to a commit; None when the stored file is derived (no upstream
        file is the same bytes).
    sha256 : str
        Checksum of the file the loader reads (hex).
    size_bytes : int
        Its size.
    licence : str
        Licence and the citation the licence asks for.
    derived : str
        For a derived file: what it was derived from and how (empty for a byte-for-byte copy).
    """

    name: str
    url: str | None
    sha256: str
    size_bytes: int
    licence: str
    derived: str = ""


#: name -> source; checksums and sizes of the files in the shared trace folder (SOURCE.md there).
TRACE_SOURCES: dict[str, TraceSource] = {s.name: s for s in (
    TraceSource("azure-code-2023", _AZURE + "AzureLLMInferenceTrace_code.csv",
                "54e9a6d2a4bd06ba1e060304b900abbc74cbea53de96506e60fe5bb4f2277fb6", 320_117, _AZURE_LICENCE),
    TraceSource("azure-conv-2023", _AZURE + "AzureLLMInferenceTrace_conv.csv",
                "2f1e5b666d4e3055fdbba98598ce2ec307767b9064e03e2fa46676dbcc7d0bf8", 719_188, _AZURE_LICENCE),
    TraceSource("mooncake-conversation", _MOONCAKE + "conversation_trace.jsonl",
                "b8cbb061a85206d729d91cdc2981f43c9e0d99209dce588d3af5f7934408b9df", 3_029_533,
                "Apache-2.0 (repository LICENSE-APACHE); cite Qin et al., \"Mooncake: Trading More Storage for "
                "Less Computation\", FAST'25"),
    TraceSource("agentic-coding", None, "5d0e54ea5731b52e1e518d90d77921d43581e9df887a57a13ee50790b463b6e3",
                5_866_117, "Apache-2.0 (https://github.com/callanjfox/kv-cache-tester LICENSE)",
                "flattened from https://github.com/callanjfox/kv-cache-tester (commit "
                "94f6046dfd9c0c8bc0cdb24a5aa6579bac8669bf, traces/trace_*.json): one row per LLM call, hash ids "
                "replaced by prefix-hit counts"),
    TraceSource("servegen:m-large", None, "53d673d5b5fa468612032dc350b46a6a13c642f580ee5eb598b2ac999846c735",
                63_567, "Apache-2.0; cite Xiang et al., arXiv:2505.09999", _SERVEGEN),
    TraceSource("servegen:m-small", None, "96eb4075c6aa4d9eef1971923d3ca46127129c1b707f11188d97458b9442540d",
                65_232, "Apache-2.0; cite Xiang et al., arXiv:2505.09999", _SERVEGEN),
    TraceSource("servegen:deepseek-r1", None, "f808d81e26a6cdc7a5a9189ee30ba185e46a44a6037e4742bd90cccaf7d15b8d",
                4_244, "Apache-2.0; cite Xiang et al., arXiv:2505.09999", _SERVEGEN),
)}


class FetchError(ConfigError):
    """A trace could not be fetched (offline, wrong checksum, derived file); the message says what to
    do by hand: the URL to download and the path to put it at.

    Parameters
    ----------
    name : str
        The registered trace (the field is ``traces fetch NAME``).
    message : str
        What failed and what to do instead.
    """

    def __init__(self, name: str, message: str):
        super().__init__(f"traces fetch {name}", message)


def fetch_dir() -> Path:
    """The folder fetched traces are stored in: ``$TOKENFACTORY_TRACES`` if set, else
    ``$XDG_DATA_HOME/tokenfactory/traces`` (``~/.local/share/tokenfactory/traces``).

    Returns
    -------
    Path
        The folder (it need not exist yet); the loaders search it.
    """
    env = os.environ.get("TOKENFACTORY_TRACES")
    if env:
        return Path(env)
    base = os.environ.get("XDG_DATA_HOME") or str(Path.home() / ".local" / "share")
    return Path(base) / "tokenfactory" / "traces"


def sha256_of(path: str | Path) -> str:
    """The hex sha256 of a file, read in 1 MiB blocks.

    Parameters
    ----------
    path : str or Path
        The file.

    Returns
    -------
    str
        64 hex digits.
    """
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def fetch_trace(name: str, relative_path: str, dest_dir: str | Path | None = None, *, url: str | None = None,
                timeout_s: float = 60.0) -> tuple[Path, bool]:
    """Download registered trace ``name`` into ``dest_dir``/``relative_path`` and verify its sha256.

    A file already there with the right checksum is kept (no download). The download goes to a
    temporary file beside the destination and is moved into place only once its checksum matches,
    so an interrupted or corrupted download never leaves a file the loaders would read.

    Parameters
    ----------
    name : str
        A key of :data:`TRACE_SOURCES`.
    relative_path : str
        Where the loaders expect the file inside the trace folder (``TraceSpec.relative_path``).
    dest_dir : str or Path, optional
        The trace folder (default :func:`fetch_dir`).
    url : str, optional
        Download from here instead of the recorded upstream URL (a mirror; the checksum is the same).
    timeout_s : float
        Network timeout per read (default 60 s).

    Returns
    -------
    (Path, bool)
        The stored file and whether it was downloaded now (False: it was already there).

    Raises
    ------
    FetchError
        When the trace is derived (no upstream file), the download fails (offline: the message
        gives the URL to fetch by hand and the path to store it at) or the checksum differs.
    """
    if name not in TRACE_SOURCES:
        raise ConfigError("trace", f"{name!r} is not a registered trace ({', '.join(TRACE_SOURCES)})")
    src = TRACE_SOURCES[name]
    dest = Path(dest_dir) if dest_dir is not None else fetch_dir()
    target = dest / relative_path
    if target.is_file() and sha256_of(target) == src.sha256:
        return target, False
    url = url or src.url
    if url is None:
        raise FetchError(name, f"the stored file is derived, not a copy of an upstream file: {src.derived}. "
                               f"Build it as its SOURCE.md describes (or copy it from a machine that has it) "
                               f"to {target} (sha256 {src.sha256})")
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=target.name + ".", suffix=".part", dir=target.parent)
    try:
        try:
            with os.fdopen(fd, "wb") as out, urllib.request.urlopen(url, timeout=timeout_s) as resp:
                while block := resp.read(1 << 20):
                    out.write(block)
        except (urllib.error.URLError, OSError, ValueError) as exc:
            reason = getattr(exc, "reason", None) or exc
            raise FetchError(name, f"could not download {url} ({reason}). Download it by hand and save it as "
                                   f"{target} (sha256 {src.sha256}); licence: {src.licence}") from None
        got = sha256_of(tmp)
        if got != src.sha256:
            raise FetchError(name, f"{url} gave a file with sha256 {got}, expected {src.sha256}; nothing was stored")
        os.replace(tmp, target)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return target, True
