import numpy as np
import pytest

from tokenfactory import ConfigError
from tokenfactory.traces import TRACES, TraceError, data_dir, load_trace, trace_available

REAL = {
    # name: (rows, kind)
    "azure-code-2023": (8819, "requests"),
    "azure-conv-2023": (19366, "requests"),
    "mooncake-conversation": (12031, "requests"),
    "agentic-coding": (49334, "requests"),
    "servegen:m-large": (2016, "rates"),
    "servegen:m-small": (2016, "rates"),
    "servegen:deepseek-r1": (144, "rates"),
}


def test_registry_names():
    assert set(REAL) <= set(TRACES)


@pytest.mark.parametrize("name", list(REAL))
def test_real_trace_loads(name):
    if not trace_available(name):
        pytest.skip(f"shared trace data absent ({data_dir()}); set TOKENFACTORY_TRACES")
    df = load_trace(name)
    rows, kind = REAL[name]
    assert len(df) == rows and df.attrs["kind"] == kind
    if kind == "requests":
        assert list(df.columns[:7]) == ["arrival_s", "input_tokens", "cached_tokens", "output_tokens",
                                        "session_id", "turn", "think_time_s"]
        assert (df["input_tokens"] >= 0).all() and (df["cached_tokens"] <= df["input_tokens"]).all()
        if not df.attrs.get("per_session_clock"):
            assert df["arrival_s"].iloc[0] == 0 and df["arrival_s"].is_monotonic_increasing
    else:
        assert df.index.name == "time_s" and df.attrs["interval_s"] == 600


def test_servegen_gaps_are_missing_not_zero():
    if not trace_available("servegen:m-small"):
        pytest.skip("shared trace data absent")
    df = load_trace("servegen:m-small")
    assert df["rate_rps"].isna().sum() == 37 and (df["rate_rps"].dropna() > 0).all()


def test_mooncake_prefix_reuse_matches_published():
    if not trace_available("mooncake-conversation"):
        pytest.skip("shared trace data absent")
    df = load_trace("mooncake-conversation")
    # SOURCE.md: 0.374 reusable prefix tokens / input tokens (infinite cache, chained hashes)
    assert df["cached_tokens"].sum() / df["input_tokens"].sum() == pytest.approx(0.374, abs=0.002)


def test_data_dir_from_environment(tmp_path, monkeypatch):
    monkeypatch.setenv("TOKENFACTORY_TRACES", str(tmp_path))
    assert data_dir() == tmp_path
    assert not trace_available("servegen:m-large")
    with pytest.raises(TraceError, match="not on this machine.*traces fetch servegen:m-large"):
        load_trace("servegen:m-large")


def _write(tmp_path, name, text):
    p = tmp_path / name
    p.write_text(text)
    return p


@pytest.mark.parametrize("name,text,needle", [
    ("missing.csv", "arrival_s,input_tokens\n0,5\n", r"missing.csv: column 'output_tokens': missing column"),
    ("negative.csv", "arrival_s,input_tokens,output_tokens\n0,5,1\n1,-3,1\n",
     r"negative.csv: row 3: column 'input_tokens': negative value"),
    ("backwards.csv", "arrival_s,input_tokens,output_tokens\n0,5,1\n2,5,1\n1,5,1\n",
     r"backwards.csv: row 4: column 'arrival_s': time goes backwards"),
    ("text.csv", "arrival_s,input_tokens,output_tokens\n0,5,1\n1,abc,1\n",
     r"text.csv: row 3: column 'input_tokens': not a number"),
    ("cached.csv", "arrival_s,input_tokens,output_tokens,cached_tokens\n0,5,1,9\n",
     r"cached.csv: row 2: column 'cached_tokens': cached_tokens exceeds"),
    ("extra.csv", "arrival_s,input_tokens,output_tokens,colour\n0,5,1,red\n", r"column 'colour': unknown column"),
    ("azure.csv", "TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46.68,3,4\nyesterday,3,4\n",
     r"azure.csv: row 3: column 'TIMESTAMP': unparsable timestamp"),
    ("rates.csv", "time_s,rate_rps\n0,1\n600,-2\n", r"rates.csv: row 3: column 'rate_rps': negative rate"),
    ("uneven.csv", "time_s,rate_rps\n0,1\n600,2\n1000,3\n", r"uneven.csv: row 3: column 'time_s': windows are not on a regular 400 s grid"),
    ("agg.csv", "window_start_s,total_rate_rps,active_clients\n0,1,1\n600,x,1\n",
     r"agg.csv: row 3: column 'total_rate_rps': not a number"),
])
def test_malformed_files_name_file_row_column(tmp_path, name, text, needle):
    with pytest.raises(TraceError, match=needle):
        load_trace(_write(tmp_path, name, text))


def test_bad_mooncake_lines(tmp_path):
    p = _write(tmp_path, "m.jsonl", '{"timestamp": 0, "input_length": 5, "output_length": 1, "hash_ids": [1]}\n{oops}\n')
    with pytest.raises(TraceError, match=r"m.jsonl: row 2: invalid JSON"):
        load_trace(p)
    p = _write(tmp_path, "n.jsonl", '{"timestamp": 0, "input_length": -5, "output_length": 1, "hash_ids": []}\n')
    with pytest.raises(TraceError, match=r"n.jsonl: row 1: column 'input_length'"):
        load_trace(p)


def test_user_formats_load_by_path(tmp_path):
    req = _write(tmp_path, "mine.csv", "arrival_s,input_tokens,output_tokens,cached_tokens,session_id,turn\n"
                                       "10,100,5,0,a,0\n12,150,6,100,a,1\n")
    df = load_trace(req)
    assert df["arrival_s"].tolist() == [0.0, 2.0] and df["cached_tokens"].tolist() == [0, 100]
    rates = _write(tmp_path, "r.csv", "time_s,rate_rps\n0,1.5\n600,\n1800,2.0\n")
    r = load_trace(rates)
    # an empty cell and a skipped window are both missing, on the regular grid
    assert r.index.tolist() == [0.0, 600.0, 1200.0, 1800.0] and r["rate_rps"].isna().sum() == 2
    sg = _write(tmp_path, "sg.csv", "window_start_s,total_rate_rps,active_clients,agg_cv2_rate_weighted\n"
                                    "0,10,2,1.5\n600,0,0,0\n")
    s = load_trace(sg)
    assert np.isnan(s["rate_rps"].iloc[1]) and s.attrs["missing_windows"] == 1
    with pytest.raises(ConfigError, match="neither a registered trace"):
        load_trace(tmp_path / "nothing.csv")


def test_a_folder_or_unreadable_file_is_a_trace_error(tmp_path):
    from tokenfactory.traces import TraceError, load_trace

    with pytest.raises(TraceError, match="is not a file"):
        load_trace(tmp_path)
    bad = tmp_path / "bin.csv"
    bad.write_bytes(b"\xff\xfe\x00\x01" * 10)
    with pytest.raises(TraceError, match="bin.csv"):
        load_trace(bad)
