#!/usr/bin/env python3
"""Concurrent greedy clients against a running glm5-serve (bench/serve.sh): each client sends one
streamed /v1/completions request of PROMPT random token ids (its own seed) for MAX_TOKENS tokens
at temperature 0 (--temperature T: sampled, prompt i with seed 1000 + i), all clients at once.
Prints per run: clients, wall time, completion tokens, aggregate tokens/s, time to first token (median and last) and per-client tokens/s, then where the
server's engine spent the run (its /metrics counters' differences: decode steps and their seconds,
ms per step, of which the host's token draws, and prefill seconds). A run in which
any request fails (an error event in its stream) prints the failures instead and makes the exit
status 1. Standard library only (the GPU machines have no network for pip)."""
import argparse
import http.client
import json
import random
import statistics
import sys
import threading
import time


def wait_ready(port, limit_s=600):
    """glm5-serve listens while it loads the model (503 until then): wait for /health."""
    t0 = time.monotonic()
    while time.monotonic() - t0 < limit_s:
        try:
            c = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
            c.request("GET", "/health")
            r = c.getresponse()
            r.read()
            c.close()
            if r.status == 200:
                return
        except OSError:
            pass
        time.sleep(0.5)
    raise SystemExit("glm5-serve not ready")


def model_id(port):
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    c.request("GET", "/v1/models")
    r = c.getresponse()
    body = json.loads(r.read())
    c.close()
    return body["data"][0]["id"]


TEMPERATURE = 0.0  # --temperature: above 0, prompt i samples with seed 1000 + i


def one(port, model, ids, max_tokens, t0, out, i, seed=0):
    req = {"model": model, "prompt": ids, "max_tokens": max_tokens, "temperature": TEMPERATURE,
           "stream": True, "stream_options": {"include_usage": True}}
    if TEMPERATURE > 0:
        req["seed"] = seed
    body = json.dumps(req)
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=600)
    c.request("POST", "/v1/completions", body=body, headers={"Content-Type": "application/json"})
    r = c.getresponse()
    if r.status != 200:
        out[i] = {"error": f"HTTP {r.status}: {r.read()[:200]!r}"}
        return
    first, toks, text = None, 0, []
    while True:
        line = r.readline()
        if not line:
            break
        line = line.strip()
        if not line.startswith(b"data: "):
            continue
        data = line[6:]
        if data == b"[DONE]":
            break
        ev = json.loads(data)
        if ev.get("error"):  # the server failed the request mid-stream
            out[i] = {"error": ev["error"].get("message", "?")}
            c.close()
            return
        if ev.get("choices") and ev["choices"][0].get("text"):
            text.append(ev["choices"][0]["text"])
            if first is None:
                first = time.monotonic() - t0
        if ev.get("usage"):
            toks = ev["usage"]["completion_tokens"]
    c.close()
    out[i] = {"ttft": first if first is not None else float("nan"), "tokens": toks, "end": time.monotonic() - t0,
              "text": "".join(text)}


METRICS = ("glm5_decode_steps_total", "glm5_decode_step_seconds_total", "glm5_prefill_seconds_total",
           "glm5_token_draw_seconds_total", "glm5_device_draw_steps_total")


def metrics(port):
    """The engine's time counters from /metrics (absent ones 0)."""
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    c.request("GET", "/metrics")
    body = c.getresponse().read().decode()
    c.close()
    got = dict.fromkeys(METRICS, 0.0)
    for line in body.splitlines():
        f = line.split()
        if len(f) == 2 and f[0] in got:
            got[f[0]] = float(f[1])
    return got


def engine_line(n, m0, m1):
    d = {k: m1[k] - m0[k] for k in METRICS}
    steps, dec, pre, draw, dev = (d[k] for k in METRICS)
    per = 1e3 * dec / steps if steps else 0.0
    return (f"engine, clients {n}: {steps:.0f} decode steps ({dev:.0f} drawn on the device), {dec:.2f} s ({per:.2f} ms "
            f"per step, of which {1e3 * draw / steps if steps else 0.0:.2f} ms token draws), prefill {pre:.2f} s")


def prompts_of(n, prompt, vocab):
    return [[random.Random(1000 + i).randrange(vocab) for _ in range(prompt)] for i in range(n)]


def run(port, model, n, prompt, max_tokens, vocab, quiet=False, texts=None):
    out = [None] * n
    prompts = prompts_of(n, prompt, vocab)
    m0 = None if quiet else metrics(port)
    t0 = time.monotonic()
    th = [threading.Thread(target=one, args=(port, model, prompts[i], max_tokens, t0, out, i, 1000 + i))
          for i in range(n)]
    for t in th:
        t.start()
    for t in th:
        t.join()
    wall = time.monotonic() - t0
    errs = [o["error"] for o in out if o and "error" in o]
    if errs or any(o is None for o in out):
        print(f"clients {n}: FAILED: {len(errs)} of {n} requests failed; first messages: {sorted(set(errs))[:3]}")
        return False
    if texts is not None:
        texts[n] = [o["text"] for o in out]
    toks = sum(o["tokens"] for o in out)
    ttft = sorted(o["ttft"] for o in out)
    per = statistics.median(o["tokens"] / (o["end"] - o["ttft"]) for o in out if o["end"] > o["ttft"])
    if quiet:
        return True
    print(f"| {n} | {wall:.2f} | {toks} | {toks / wall:.1f} | {statistics.median(ttft):.3f} | {ttft[-1]:.3f} | "
          f"{per:.1f} |", flush=True)
    ENGINE.append(engine_line(n, m0, metrics(port)))
    return True


ENGINE = []  # engine_line of each run, printed after the table


def verify(port, model, texts, n, prompt, max_tokens, vocab):
    """Each of the first n prompts sent alone, one after another; the concurrent runs' outputs
    (texts: clients -> outputs of the runs that succeeded) compared with those."""
    alone, failed = [], []
    for i, ids in enumerate(prompts_of(n, prompt, vocab)):
        out = [None]
        one(port, model, ids, max_tokens, time.monotonic(), out, 0, 1000 + i)
        alone.append(out[0].get("text"))
        if "error" in out[0]:
            failed.append((i, out[0]["error"]))
    if failed:
        print(f"verify: {len(failed)} of {n} prompts failed alone too: {failed[:4]}")
    ok = not failed
    for c in sorted(texts):
        bad = [i for i, t in enumerate(texts[c]) if t != alone[i]]
        print(f"verify: clients {c}: {c - len(bad)} of {c} outputs equal to the prompt sent alone"
              + (f"; differing: {bad[:8]}" if bad else ""))
        ok = ok and not bad
    return ok


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--clients", default="1,8,32")
    ap.add_argument("--prompt", type=int, default=512)
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--vocab", type=int, default=154880)
    ap.add_argument("--verify", action="store_true",
                    help="then send each prompt alone and compare its output with the concurrent runs'")
    ap.add_argument("--temperature", type=float, default=0.0,
                    help="sample at this temperature (prompt i with seed 1000 + i) instead of greedy")
    a = ap.parse_args()
    global TEMPERATURE
    TEMPERATURE = a.temperature
    wait_ready(a.port)
    model = model_id(a.port)
    run(a.port, model, 1, 16, 4, a.vocab, quiet=True)  # warm-up: first-call set-up out of the figures
    print("| clients | wall s | completion tokens | aggregate tok/s | TTFT median s | TTFT last s | "
          "per-client tok/s (median, after its first token) |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    texts = {}
    ok = all([run(a.port, model, int(n), a.prompt, a.max_tokens, a.vocab, texts=texts) for n in a.clients.split(",")])
    for line in ENGINE:
        print(line)
    if a.verify:
        n = max(int(c) for c in a.clients.split(","))
        ok = verify(a.port, model, texts, n, a.prompt, a.max_tokens, a.vocab) and ok
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
