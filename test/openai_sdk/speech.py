"""The official OpenAI Python SDK against an mm3 server (test_api_openai_sdk runs it
against the fake engine): the models endpoints, a whole file, OpenAI's server-sent
events through the SDK's own SSE decoder, a raw audio stream, and a 400 naming its field.

    python3 test/openai_sdk/speech.py http://127.0.0.1:PORT FRAMES

FRAMES is the number of PCM sample frames the server's engine makes per song.
Exit 0: passed, 1: failed, 77: the openai package is not importable (skipped)."""
import base64
import sys

try:
    import openai
    from openai import OpenAI
except ImportError:
    print("skip: the openai package is not importable (pip install openai)")
    sys.exit(77)

base, frames = sys.argv[1], int(sys.argv[2])
client = OpenAI(base_url=base + "/v1", api_key="none", max_retries=0)
MODEL = "MiniMax-Music3"
SONG = dict(model=MODEL, voice="default", input="[verse]\nla la la", instructions="warm lo-fi, 80 bpm")

models = client.models.list()
assert [m.id for m in models.data] == [MODEL], models
model = client.models.retrieve(MODEL)
assert model.id == MODEL and model.created > 0 and model.owned_by == "mm3", model

whole = client.audio.speech.create(**SONG, response_format="pcm").content
assert len(whole) == frames * 4, len(whole)

# stream_format "sse": decoded with the SDK's own SSE parser
with client.audio.speech.with_streaming_response.create(**SONG, response_format="pcm", stream_format="sse") as resp:
    assert resp.headers["content-type"] == "text/event-stream", resp.headers
    try:
        from openai._streaming import SSEDecoder
        events = [(e.event, e.json()) for e in SSEDecoder().iter_bytes(resp.iter_bytes())]
    except ImportError:  # the decoder is private: fall back on the lines
        import json
        lines = [l for l in resp.iter_lines() if l.startswith("data: ")]
        events = [(json.loads(l[6:])["type"], json.loads(l[6:])) for l in lines]
audio = b""
for name, data in events[:-1]:
    assert name == data["type"] == "speech.audio.delta", (name, data.keys())
    audio += base64.b64decode(data["audio"])
name, done = events[-1]
assert name == done["type"] == "speech.audio.done", (name, done)
assert done["usage"]["output_tokens"] > 0, done
assert audio == whole, (len(audio), len(whole))

# stream_format "audio": the raw bytes as they come
with client.audio.speech.with_streaming_response.create(**SONG, response_format="pcm", stream_format="audio") as resp:
    streamed = b"".join(resp.iter_bytes())
assert streamed == whole, (len(streamed), len(whole))

# a value mm3 cannot honour: 400 naming the field, as the SDK's BadRequestError
try:
    client.audio.speech.create(**SONG, extra_body={"language": "French"})
    raise AssertionError("language French was accepted")
except openai.BadRequestError as e:
    assert e.status_code == 400 and e.body.get("param") == "language", e.body

print("openai %s: models, whole file, sse (%d events), audio stream, 400: ok" % (openai.__version__, len(events)))
