"""Structured output's cost per generated token in `fmoe serve`: decode milliseconds per
token (the response's `timings.predicted_ms` over its tokens after the first) of free text
and of two schemas, requests interleaved on one server process (--parallel 1), so that
the machine's load falls on all of them alike. Not a test (docs/serving.md quotes it).

    python tests/bench/bench_json_serve.py [BUILD_DIR] [--model DIR] [--rounds N]
"""
import argparse
import http.client
import json
import pathlib
import subprocess
import tempfile
import time

STRING = {"type": "object", "properties": {"s": {"type": "string"}}, "required": ["s"],
          "additionalProperties": False}
PERSON = {"type": "object",
          "properties": {"name": {"type": "string"}, "age": {"type": "integer"},
                         "c": {"enum": ["red", "green"]},
                         "xs": {"type": "array", "items": {"type": "number"}}},
          "required": ["name", "age", "c", "xs"], "additionalProperties": False}
MODES = {"free": None,
         "schema_string": {"type": "json_schema", "json_schema": {"name": "s", "schema": STRING}},
         "schema_person": {"type": "json_schema", "json_schema": {"name": "p", "schema": PERSON}}}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("build", nargs="?", default="build")
    ap.add_argument("--model")
    ap.add_argument("--rounds", type=int, default=3)
    a = ap.parse_args()
    port_file = pathlib.Path(tempfile.mkdtemp()) / "port"
    cmd = [str(pathlib.Path(a.build) / "cmd" / "fmoe"), "serve", "--port", "0", "--port-file",
           str(port_file), "--quiet", "--parallel", "1", "--threads", "1"]
    if a.model:
        cmd += ["--model", a.model]
    proc = subprocess.Popen(cmd)
    try:
        while not (port_file.exists() and port_file.read_text().strip()):
            if proc.poll() is not None:
                raise SystemExit("fmoe serve exited")
            time.sleep(0.05)
        port = int(port_file.read_text())
        time.sleep(0.5)
        tokens = {m: 0 for m in MODES}
        ms = {m: 0.0 for m in MODES}
        for _ in range(a.rounds):
            for seed in range(6):
                for mode, rf in MODES.items():
                    body = {"model": "m", "messages": [{"role": "user", "content": "Write."}],
                            "max_tokens": 64, "temperature": 1, "seed": seed}
                    if rf:
                        body["response_format"] = rf
                    else:
                        body["ignore_eos"] = True
                    c = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
                    c.request("POST", "/v1/chat/completions", json.dumps(body),
                              {"Content-Type": "application/json"})
                    r = json.loads(c.getresponse().read())
                    n = r["usage"]["completion_tokens"]
                    if n > 1:
                        tokens[mode] += n - 1
                        ms[mode] += r["timings"]["predicted_ms"]
        print(json.dumps({m: {"tokens": tokens[m], "ms_per_token": round(ms[m] / tokens[m], 4)}
                          for m in MODES}))
    finally:
        proc.terminate()
        proc.wait()


if __name__ == "__main__":
    main()
