#!/usr/bin/env python3
"""Client for glm5-serve used by tests/test_serve.c: greedy completions and chat completions,
streaming and not, and a chat with tools (a named tool_choice, thinking off; then a second turn
carrying the tool call and its result), through the `openai` package when it is installed (the
test makes a venv with it from PyPI when it can: scripts/pyenv.sh), otherwise plain HTTP
(urllib). Prints one JSON object with the texts, the tool calls and which client produced them."""
import argparse
import json
import sys
import urllib.request


def with_openai(a):
    import openai  # noqa: F401  (ImportError selects the urllib path)

    c = openai.OpenAI(base_url=f"http://127.0.0.1:{a.port}/v1", api_key=a.api_key or "none")
    msgs = [{"role": "user", "content": a.prompt}]
    model = c.models.list().data[0].id
    if c.models.retrieve(model).id != model:
        raise SystemExit("models.retrieve gave another id")
    kw = dict(model=model, max_tokens=a.max_tokens, temperature=0)
    out = {"client": "openai"}
    out["completions"] = c.completions.create(prompt=a.prompt, **kw).choices[0].text
    out["completions_stream"] = "".join(
        ch.choices[0].text for ch in c.completions.create(prompt=a.prompt, stream=True, **kw) if ch.choices)
    out["chat"] = c.chat.completions.create(messages=msgs, **kw).choices[0].message.content
    out["chat_stream"] = "".join(
        (ch.choices[0].delta.content or "")
        for ch in c.chat.completions.create(messages=msgs, stream=True, **kw) if ch.choices)
    r = c.chat.completions.create(messages=msgs, **kw)
    out["chat_reasoning"] = getattr(r.choices[0].message, "reasoning_content", None)
    out["chat_reasoning_stream"] = "".join(
        (getattr(ch.choices[0].delta, "reasoning_content", None) or "")
        for ch in c.chat.completions.create(messages=msgs, stream=True, **kw) if ch.choices)
    tkw = dict(kw, max_tokens=a.tool_max_tokens, tools=TOOLS, tool_choice=CHOICE,
               extra_body={"chat_template_kwargs": {"enable_thinking": False}})
    tmsgs = [{"role": "user", "content": "Weather in Paris?"}]
    r = c.chat.completions.create(messages=tmsgs, **tkw)
    tc = r.choices[0].message.tool_calls[0]
    out["tool"] = [tc.function.name, tc.function.arguments, r.choices[0].finish_reason]
    name, args, finish = "", "", None
    for ch in c.chat.completions.create(messages=tmsgs, stream=True, **tkw):
        if not ch.choices:
            continue
        for d in ch.choices[0].delta.tool_calls or []:
            name += d.function.name or ""
            args += d.function.arguments or ""
        finish = ch.choices[0].finish_reason or finish
    out["tool_stream"] = [name, args, finish]
    turn2 = tmsgs + [{"role": "assistant", "content": None, "tool_calls": [
        {"id": tc.id, "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}]},
        {"role": "tool", "tool_call_id": tc.id, "content": "21 C, sunny"}]
    r = c.chat.completions.create(messages=turn2, **dict(kw, tools=TOOLS))
    out["turn2_finish"] = r.choices[0].finish_reason
    return out


TOOLS = [{"type": "function", "function": {
    "name": "get_weather", "description": "Weather of a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}]
CHOICE = {"type": "function", "function": {"name": "get_weather"}}


def post(a, path, body):
    req = urllib.request.Request(
        f"http://127.0.0.1:{a.port}{path}", data=json.dumps(body).encode(), method="POST",
        headers={"Content-Type": "application/json", "Authorization": f"Bearer {a.api_key}"})
    with urllib.request.urlopen(req, timeout=120) as r:
        return r.read().decode()


def events(text):
    out = []
    for block in text.split("\n\n"):
        if block.startswith("data: "):
            data = block[6:]
            if data == "[DONE]":
                out.append(None)
            else:
                out.append(json.loads(data))
    if not out or out[-1] is not None:
        raise SystemExit("stream did not end with data: [DONE]")
    return [e for e in out if e is not None]


def model_id(a):
    req = urllib.request.Request(f"http://127.0.0.1:{a.port}/v1/models",
                                 headers={"Authorization": f"Bearer {a.api_key}"})
    with urllib.request.urlopen(req, timeout=120) as r:
        return json.loads(r.read().decode())["data"][0]["id"]


def with_urllib(a):
    base = dict(model=model_id(a), max_tokens=a.max_tokens, temperature=0)
    msgs = [{"role": "user", "content": a.prompt}]
    out = {"client": "urllib"}
    out["completions"] = json.loads(post(a, "/v1/completions", dict(base, prompt=a.prompt)))["choices"][0]["text"]
    evs = events(post(a, "/v1/completions", dict(base, prompt=a.prompt, stream=True)))
    out["completions_stream"] = "".join(e["choices"][0]["text"] for e in evs if e["choices"])
    out["chat"] = json.loads(post(a, "/v1/chat/completions", dict(base, messages=msgs)))["choices"][0]["message"]["content"]
    evs = events(post(a, "/v1/chat/completions", dict(base, messages=msgs, stream=True)))
    out["chat_stream"] = "".join(e["choices"][0]["delta"].get("content") or "" for e in evs if e["choices"])
    m = json.loads(post(a, "/v1/chat/completions", dict(base, messages=msgs)))["choices"][0]["message"]
    out["chat_reasoning"] = m.get("reasoning_content")
    evs = events(post(a, "/v1/chat/completions", dict(base, messages=msgs, stream=True)))
    out["chat_reasoning_stream"] = "".join(e["choices"][0]["delta"].get("reasoning_content") or ""
                                           for e in evs if e["choices"])
    tb = dict(base, max_tokens=a.tool_max_tokens, tools=TOOLS, tool_choice=CHOICE,
              chat_template_kwargs={"enable_thinking": False}, messages=[{"role": "user", "content": "Weather in Paris?"}])
    ch = json.loads(post(a, "/v1/chat/completions", tb))["choices"][0]
    tc = ch["message"]["tool_calls"][0]
    out["tool"] = [tc["function"]["name"], tc["function"]["arguments"], ch["finish_reason"]]
    name, args, finish = "", "", None
    for e in events(post(a, "/v1/chat/completions", dict(tb, stream=True))):
        if not e["choices"]:
            continue
        for d in e["choices"][0]["delta"].get("tool_calls") or []:
            name += d["function"].get("name") or ""
            args += d["function"].get("arguments") or ""
        finish = e["choices"][0]["finish_reason"] or finish
    out["tool_stream"] = [name, args, finish]
    turn2 = tb["messages"] + [{"role": "assistant", "content": None, "tool_calls": [
        {"id": tc["id"], "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}]},
        {"role": "tool", "tool_call_id": tc["id"], "content": "21 C, sunny"}]
    out["turn2_finish"] = json.loads(post(a, "/v1/chat/completions", dict(base, tools=TOOLS, messages=turn2)))[
        "choices"][0]["finish_reason"]
    return out


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--api-key", default="")
    p.add_argument("--prompt", required=True)
    p.add_argument("--max-tokens", type=int, default=10)
    p.add_argument("--tool-max-tokens", type=int, default=3)
    a = p.parse_args()
    try:
        out = with_openai(a)
    except ImportError:
        out = with_urllib(a)
    json.dump(out, sys.stdout)
    sys.stdout.write("\n")


if __name__ == "__main__":
    main()
