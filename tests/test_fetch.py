"""`tokenfactory traces fetch` against a local HTTP server (loopback only) serving small fixture files:
the checksum is verified before anything is stored, the stored file is where `traces list` and the
loaders find it, and offline the error gives the URL to fetch by hand."""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import http.server
import threading

import pytest

from tokenfactory.cli import main
from tokenfactory.traces import TRACES, load_trace, trace_available, trace_path
from tokenfactory.traces import fetch as fetch_mod
from tokenfactory.traces.fetch import TRACE_SOURCES, FetchError, fetch_trace, sha256_of

AZURE_ROWS = ("TIMESTAMP,ContextTokens,GeneratedTokens\n"
              "2023-11-16 18:15:46.6805900,374,44\n2023-11-16 18:15:50.9951690,396,109\n"
              "2023-11-16 18:15:51.2910520,879,187\n")


@pytest.fixture
def server(tmp_path):
    """An HTTP server on 127.0.0.1 (an ephemeral port) serving tmp_path/www."""
    www = tmp_path / "www"
    www.mkdir()
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(www))
    handler.log_message = lambda *a, **k: None
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    try:
        yield www, f"http://127.0.0.1:{httpd.server_address[1]}"
    finally:
        httpd.shutdown()
        httpd.server_close()
        thread.join(5)


@pytest.fixture
def fixture_source(server, monkeypatch):
    """azure-conv-2023's source pointed at the local server, with the fixture's checksum."""
    www, base = server
    (www / "conv.csv").write_text(AZURE_ROWS)
    digest = hashlib.sha256(AZURE_ROWS.encode()).hexdigest()
    src = dataclasses.replace(TRACE_SOURCES["azure-conv-2023"], url=f"{base}/conv.csv", sha256=digest)
    monkeypatch.setitem(TRACE_SOURCES, "azure-conv-2023", src)
    return www, base, digest


def test_every_registered_trace_has_a_source():
    assert set(TRACE_SOURCES) == set(TRACES)
    for s in TRACE_SOURCES.values():
        assert len(s.sha256) == 64 and s.licence
        assert (s.url is None) == bool(s.derived), s.name   # a URL, or how the file was derived
        if s.url:
            assert s.url.startswith("https://raw.githubusercontent.com/") and "/" + TRACES[s.name].relative_path.split("/")[-1] in s.url


def test_shared_copies_match_the_recorded_checksums():
    present = [n for n in TRACES if trace_available(n)]
    if not present:
        pytest.skip("no shared trace data on this machine")
    for n in present:
        assert sha256_of(trace_path(n)) == TRACE_SOURCES[n].sha256, n


def test_fetch_downloads_verifies_and_is_found(fixture_source, tmp_path, monkeypatch, capsys):
    store = tmp_path / "store"
    monkeypatch.setenv("TOKENFACTORY_TRACES", str(store))
    assert not trace_available("azure-conv-2023")
    assert main(["traces", "fetch", "azure-conv-2023"]) == 0
    out = capsys.readouterr().out
    assert "downloaded, sha256 verified" in out
    path = store / TRACES["azure-conv-2023"].relative_path
    assert path.read_text() == AZURE_ROWS and trace_path("azure-conv-2023") == path
    assert len(load_trace("azure-conv-2023")) == 3
    assert main(["traces", "list"]) == 0
    line = next(l for l in capsys.readouterr().out.splitlines() if "azure-conv-2023" in l)
    assert " yes " in line
    # a second fetch keeps the verified file
    assert main(["traces", "fetch", "azure-conv-2023"]) == 0
    assert "already there" in capsys.readouterr().out


def test_fetch_into_the_user_folder_without_the_environment(fixture_source, tmp_path, monkeypatch):
    monkeypatch.delenv("TOKENFACTORY_TRACES", raising=False)
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "xdg"))
    monkeypatch.setattr("tokenfactory.traces.loaders.data_dir", lambda: tmp_path / "no-shared")
    assert main(["traces", "fetch", "azure-conv-2023"]) == 0
    assert trace_path("azure-conv-2023") == tmp_path / "xdg" / "tokenfactory" / "traces" / \
        TRACES["azure-conv-2023"].relative_path


def test_a_wrong_checksum_stores_nothing(fixture_source, tmp_path):
    www, base, _ = fixture_source
    (www / "conv.csv").write_text(AZURE_ROWS + "2023-11-16 18:15:52.0,1,1\n")   # tampered
    with pytest.raises(FetchError, match="expected"):
        fetch_trace("azure-conv-2023", TRACES["azure-conv-2023"].relative_path, tmp_path / "store")
    assert not any(p.is_file() for p in (tmp_path / "store").rglob("*"))


def test_offline_names_the_url_to_fetch_by_hand(server, tmp_path, monkeypatch, capsys):
    _, base = server
    url = f"{base}/missing.csv"    # a 404 from the local server stands in for no network
    monkeypatch.setitem(TRACE_SOURCES, "azure-code-2023",
                        dataclasses.replace(TRACE_SOURCES["azure-code-2023"], url=url))
    monkeypatch.setenv("TOKENFACTORY_TRACES", str(tmp_path / "store"))
    assert main(["traces", "fetch", "azure-code-2023"]) == 2
    err = capsys.readouterr().err
    assert url in err and "by hand" in err and TRACES["azure-code-2023"].relative_path in err


def test_unreachable_host_fails_with_the_upstream_url(tmp_path, monkeypatch):
    src = TRACE_SOURCES["mooncake-conversation"]
    monkeypatch.setattr(fetch_mod.urllib.request, "urlopen",
                        lambda *a, **k: (_ for _ in ()).throw(fetch_mod.urllib.error.URLError("no network")))
    with pytest.raises(FetchError, match="no network") as e:
        fetch_trace(src.name, TRACES[src.name].relative_path, tmp_path)
    assert src.url in str(e.value)


def test_derived_traces_say_how_they_were_made(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("TOKENFACTORY_TRACES", str(tmp_path))
    assert main(["traces", "fetch", "servegen:m-large"]) == 2
    assert "derived" in capsys.readouterr().err


def test_fetch_all_through_a_mirror(server, tmp_path, monkeypatch, capsys):
    www, base = server
    (www / "AzureLLMInferenceTrace_conv.csv").write_text(AZURE_ROWS)
    digest = hashlib.sha256(AZURE_ROWS.encode()).hexdigest()
    for n in TRACE_SOURCES:   # only azure-conv is on the mirror: the others fail with their own message
        monkeypatch.setitem(TRACE_SOURCES, n, dataclasses.replace(TRACE_SOURCES[n], sha256=digest))
    monkeypatch.setenv("TOKENFACTORY_TRACES", str(tmp_path / "store"))
    assert main(["traces", "fetch", "all", "--mirror", base]) == 1
    out = capsys.readouterr().out
    assert "azure-conv-2023: downloaded" in out and "mooncake-conversation: not fetched" in out
    assert f"{base}/conversation_trace.jsonl" in out and "derived" in out
    assert trace_available("azure-conv-2023") and not trace_available("mooncake-conversation")
