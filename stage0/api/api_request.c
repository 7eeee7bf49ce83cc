#include "stage0/api/api_request.h"

#include <ctype.h>
#include <errno.h>
#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>

#include <jansson.h>

#include "common/error.h"
#include "common/replay_file.h"
#include "stage0/api/base64.h"

void api_limits_default(struct api_limits *lim)
{
    lim->max_frames = 9000;
    lim->default_frames = 9000;
    lim->frame_rate = 25.0;
    lim->max_text_chars = 20000;
    lim->default_sample_rate = 44100;
    lim->default_seed = 0;
    lim->default_steps = 30;
    lim->default_guidance_scale = 1.7f;
    lim->default_flow_shift = 0.0f;
    lim->default_cfg_scale = 1.5f;
}

/* Fields whose values the model's recipe fixes: named in the 400 so a client
 * learns why its knob is refused rather than seeing it silently ignored. */
static const char *const recipe_fixed[] = {"temperature", "top_p", "top_k", "repetition_penalty"};

/* Fields other servers' clients send (vLLM-Omni's speech request, SGLang-Omni's): accepted at
 * their neutral value, which asks for nothing this model does not do; any other value is a
 * 400 naming the field, never silently ignored. */
enum neutral_kind {
    NEUTRAL_NULL,          /* only null */
    NEUTRAL_FALSE,         /* null or false */
    NEUTRAL_EMPTY_STRING,  /* null or "" */
    NEUTRAL_EMPTY_OBJECT,  /* null or {} */
    NEUTRAL_AUTO,          /* null or "auto" (any case) */
    NEUTRAL_MUSIC,         /* null or "music" (any case) */
    NEUTRAL_DEFAULT_VOICE, /* null, "" or "default" (any case) */
};

static const struct {
    const char *name;
    enum neutral_kind kind;
    const char *why; /* what the 400 says after "field 'X': " */
} neutral_fields[] = {
    {"language", NEUTRAL_AUTO, "the lyrics set the language: use null or \"auto\""},
    {"task_type", NEUTRAL_MUSIC, "this model has one task: use null or \"music\""},
    {"ref_audio", NEUTRAL_EMPTY_STRING, "this model takes no reference audio: use null"},
    {"ref_text", NEUTRAL_EMPTY_STRING, "this model takes no reference audio or text: use null"},
    {"x_vector_only_mode", NEUTRAL_FALSE, "this model takes no reference audio: use null or false"},
    {"extra_params", NEUTRAL_EMPTY_OBJECT, "no extra parameters are accepted: use null or {}"},
    {"speaker", NEUTRAL_DEFAULT_VOICE, "this model has no speakers: use null, \"\" or \"default\""},
    {"voice", NEUTRAL_DEFAULT_VOICE, "this model has no voices: use null, \"\" or \"default\""},
    {"word_timestamps", NEUTRAL_FALSE, "word timestamps are not produced: use null or false"},
    {"initial_codec_chunk_frames", NEUTRAL_NULL, "stage 1 sets the window size: use null"},
    {"non_streaming_mode", NEUTRAL_NULL, "a speech prompt mode: use null"},
};

static bool neutral_value(enum neutral_kind kind, json_t *v)
{
    if (json_is_null(v)) return true;
    const char *s = json_string_value(v);
    switch (kind) {
    case NEUTRAL_NULL:
        return false;
    case NEUTRAL_FALSE:
        return json_is_false(v);
    case NEUTRAL_EMPTY_STRING:
        return s && !s[0];
    case NEUTRAL_EMPTY_OBJECT:
        return json_is_object(v) && json_object_size(v) == 0;
    case NEUTRAL_AUTO:
        return s && strcasecmp(s, "auto") == 0;
    case NEUTRAL_MUSIC:
        return s && strcasecmp(s, "music") == 0;
    case NEUTRAL_DEFAULT_VOICE:
        return s && (!s[0] || strcasecmp(s, "default") == 0);
    }
    return false;
}

#define RESPONSE_FORMATS "wav, pcm, flac, mp3 or opus"

struct parse_ctx {
    const struct api_limits *lim;
    char *field;
    size_t field_cap;
};

static int bad(struct parse_ctx *c, const char *field, const char *fmt, const char *detail)
{
    snprintf(c->field, c->field_cap, "%s", field);
    return mm3_errorf(-EINVAL, fmt, field, detail);
}

static size_t utf8_chars(const char *s)
{
    size_t n = 0;
    for (; *s; s++)
        if (((unsigned char)*s & 0xC0) != 0x80) n++;
    return n;
}

static bool blank(const char *s)
{
    for (; *s; s++)
        if (!isspace((unsigned char)*s)) return false;
    return true;
}

/* One text field under two accepted names (compat name, our name). Optional (absent:
 * "", *given 0) for a continuation, which takes the continued song's. */
static int take_text(struct parse_ctx *c, json_t *root, const char *compat, const char *ours, bool optional,
                     char **out, bool *given)
{
    json_t *a = json_object_get(root, compat), *b = json_object_get(root, ours);
    if (a && json_is_null(a)) a = NULL;
    if (b && json_is_null(b)) b = NULL;
    if (a && b) {
        snprintf(c->field, c->field_cap, "%s", ours);
        return mm3_errorf(-EINVAL, "fields '%s' and '%s' mean the same thing: give only one", compat, ours);
    }
    json_t *v = a ? a : b;
    const char *name = a ? compat : ours;
    *given = v != NULL;
    if (!v && optional) {
        *out = strdup("");
        return *out ? 0 : mm3_errorf(-ENOMEM, "out of memory");
    }
    if (!v) { /* named as OpenAI-style clients know it */
        snprintf(c->field, c->field_cap, "%s", compat);
        return mm3_errorf(-EINVAL, "field '%s' (or '%s') is required", compat, ours);
    }
    if (!json_is_string(v)) return bad(c, name, "field '%s': expected a string%s", "");
    const char *s = json_string_value(v);
    if (blank(s)) return bad(c, name, "field '%s': must not be empty%s", "");
    if (utf8_chars(s) > c->lim->max_text_chars) {
        char d[96];
        snprintf(d, sizeof d, " (at most %zu characters; the prompt is also capped at 5000 tokens)",
                 c->lim->max_text_chars);
        return bad(c, name, "field '%s': too long%s", d);
    }
    *out = strdup(s);
    if (!*out) return mm3_errorf(-ENOMEM, "out of memory");
    return 0;
}

static bool is_number(json_t *v)
{
    return json_is_integer(v) || json_is_real(v);
}

static int take_int(struct parse_ctx *c, json_t *v, const char *name, long long lo, long long hi, long long *out)
{
    if (!json_is_integer(v)) {
        char d[80];
        snprintf(d, sizeof d, " %lld..%lld", lo, hi);
        return bad(c, name, "field '%s': expected an integer in%s", d);
    }
    long long x = json_integer_value(v);
    if (x < lo || x > hi) {
        char d[96];
        snprintf(d, sizeof d, " %lld..%lld, got %lld", lo, hi, x);
        return bad(c, name, "field '%s': out of range: expected%s", d);
    }
    *out = x;
    return 0;
}

static int take_number(struct parse_ctx *c, json_t *v, const char *name, double lo, double hi, double *out)
{
    char d[96];
    snprintf(d, sizeof d, " %g..%g", lo, hi);
    if (!is_number(v)) return bad(c, name, "field '%s': expected a number in%s", d);
    double x = json_number_value(v);
    if (!isfinite(x) || x < lo || x > hi) return bad(c, name, "field '%s': out of range: expected%s", d);
    *out = x;
    return 0;
}

/* continue_from (a request id: 32 lowercase hex digits) and return ("new" or "whole",
 * only with continue_from). */
static int take_continuation(struct parse_ctx *c, json_t *root, struct mm3_job_params *p)
{
    json_t *v = json_object_get(root, "continue_from");
    if (v && !json_is_null(v)) {
        const char *s = json_string_value(v);
        size_t n = s ? strlen(s) : 0;
        bool hex = n == MM3_JOB_PUBLIC_ID_LEN;
        for (size_t i = 0; hex && i < n; i++)
            hex = (s[i] >= '0' && s[i] <= '9') || (s[i] >= 'a' && s[i] <= 'f');
        if (!hex)
            return bad(c, "continue_from", "field '%s': expected a request id (%s) of a finished song",
                       "32 lowercase hex digits, as X-Request-Id gives it");
        memcpy(p->continue_from, s, n + 1);
    }
    v = json_object_get(root, "continue_journal");
    if (v && !json_is_null(v)) {
        const char *s = json_string_value(v);
        if (p->continue_from[0])
            return bad(c, "continue_journal", "field '%s': give continue_from or %s, not both",
                       "continue_journal (an uploaded journal file)");
        if (!s || !s[0])
            return bad(c, "continue_journal", "field '%s': expected %s", "a journal file (.mm3j) in base64");
        int rc = base64_decode(s, json_string_length(v), &p->journal, &p->journal_len);
        if (rc == -EINVAL) {
            char why[160]; /* the decoder's message, before the error buffer is reused */
            snprintf(why, sizeof why, "%s", mm3_last_error());
            return bad(c, "continue_journal", "field '%s': %s", why);
        }
        if (rc < 0) return rc;
    }
    bool cont = p->continue_from[0] || p->journal;
    v = json_object_get(root, "return");
    if (v && !json_is_null(v)) {
        const char *s = json_string_value(v);
        if (!s || (strcmp(s, "new") != 0 && strcmp(s, "whole") != 0))
            return bad(c, "return", "field '%s': expected \"new\" (the continuation's audio) or \"whole\"%s",
                       " (the whole song)");
        if (!cont)
            return bad(c, "return", "field '%s' needs continue_from or continue_journal%s",
                       " (it says what a continuation answers)");
        p->return_whole = strcmp(s, "whole") == 0;
    }
    return 0;
}

static int lora_index(const struct api_limits *lim, const char *name)
{
    for (int i = 0; i < lim->n_lora; i++)
        if (!strcmp(lim->lora_names[i], name)) return i;
    return -1;
}

/* The adapter: `model` when it names one (any other model name is the base model, as
 * OpenAI speech clients send a name of their own), or `lora`, which must name one. */
static int take_lora(struct parse_ctx *c, json_t *root, struct mm3_job_params *p)
{
    json_t *m = json_object_get(root, "model"), *l = json_object_get(root, "lora");
    p->lora[0] = 0;
    if (m && !json_is_null(m)) {
        if (!json_is_string(m)) return bad(c, "model", "field '%s': expected a string%s", "");
        if (lora_index(c->lim, json_string_value(m)) >= 0) {
            snprintf(p->lora, sizeof p->lora, "%s", json_string_value(m));
            p->given |= MM3_GIVEN_LORA;
        }
    }
    if (!l || json_is_null(l)) return 0;
    if (!json_is_string(l)) return bad(c, "lora", "field '%s': expected a string%s", " naming an adapter");
    const char *name = json_string_value(l);
    if (lora_index(c->lim, name) < 0) {
        char known[MM3_JOB_LORA_MAX * 9] = "";
        for (int i = 0; i < c->lim->n_lora; i++)
            snprintf(known + strlen(known), sizeof known - strlen(known), "%s'%s'", i ? ", " : "",
                     c->lim->lora_names[i]);
        snprintf(c->field, c->field_cap, "lora");
        return mm3_errorf(-ENOENT, "field 'lora': no adapter '%.80s' here; %s%s (GET /v1/models lists them)", name,
                          c->lim->n_lora ? "this server serves " : "this server serves no adapters", known);
    }
    if (p->lora[0] && strcmp(p->lora, name))
        return bad(c, "lora", "field '%s': names another adapter than `model` does%s", "; give one of them");
    snprintf(p->lora, sizeof p->lora, "%s", name);
    p->given |= MM3_GIVEN_LORA;
    return 0;
}

static int parse_fields(struct parse_ctx *c, json_t *root, struct mm3_job_params *p)
{
    const struct api_limits *lim = c->lim;
    static const char *const known[] = {
        "input",          "lyrics",     "instructions", "caption",         "max_new_tokens", "min_new_tokens",
        "min_duration_s", "duration_s", "seed",         "response_format", "sample_rate",    "num_inference_steps",
        "guidance_scale", "cfg_scale",  "stream",       "stream_format",   "model",          "speed",
        "x_replay_file",  "ignore_eos", "flow_shift",   "allow_stall",     "continue_from",  "continue_journal",
        "return",         "lora",
    };
    const char *key;
    json_t *v;
    json_object_foreach(root, key, v)
    {
        for (size_t i = 0; i < sizeof recipe_fixed / sizeof *recipe_fixed; i++)
            if (strcmp(key, recipe_fixed[i]) == 0 && !json_is_null(v))
                return bad(c, key, "field '%s' is not accepted%s",
                           ": the model's recipe fixes the sampling parameters");
        bool found = false;
        for (size_t i = 0; i < sizeof neutral_fields / sizeof *neutral_fields && !found; i++) {
            if (strcmp(key, neutral_fields[i].name) != 0) continue;
            if (!neutral_value(neutral_fields[i].kind, v))
                return bad(c, key, "field '%s': %s", neutral_fields[i].why);
            found = true;
        }
        for (size_t i = 0; i < sizeof known / sizeof *known && !found; i++)
            found = strcmp(key, known[i]) == 0;
        for (size_t i = 0; i < sizeof recipe_fixed / sizeof *recipe_fixed && !found; i++)
            found = strcmp(key, recipe_fixed[i]) == 0;
        if (!found) return bad(c, key, "unknown field '%s'%s", " (see docs/api.md for the accepted fields)");
    }

    int rc;
    /* Nulls count as absent: some clients send every optional field. */
#define GET(name) ((v = json_object_get(root, name)) && !json_is_null(v))
#define GIVEN(bit) (p->given |= (bit))
    if ((rc = take_continuation(c, root, p)) < 0) return rc;
    bool cont = p->continue_from[0] || p->journal, given;
    if ((rc = take_text(c, root, "input", "lyrics", cont, &p->lyrics, &given)) < 0) return rc;
    if (given) GIVEN(MM3_GIVEN_LYRICS);
    if ((rc = take_text(c, root, "instructions", "caption", cont, &p->caption, &given)) < 0) return rc;
    if (given) GIVEN(MM3_GIVEN_CAPTION);

    long long iv;
    double dv;
    json_t *frames_v = json_object_get(root, "max_new_tokens");
    json_t *dur_v = json_object_get(root, "duration_s");
    if (frames_v && json_is_null(frames_v)) frames_v = NULL;
    if (dur_v && json_is_null(dur_v)) dur_v = NULL;
    p->max_frames = lim->default_frames;
    if (frames_v || dur_v) GIVEN(MM3_GIVEN_LENGTH);
    if (frames_v && dur_v) {
        snprintf(c->field, c->field_cap, "duration_s");
        return mm3_errorf(-EINVAL, "fields 'max_new_tokens' and 'duration_s' both set the length: "
                                   "give only one");
    }
    if (frames_v) {
        if ((rc = take_int(c, frames_v, "max_new_tokens", 1, lim->max_frames, &iv)) < 0) return rc;
        p->max_frames = (int32_t)iv;
    }
    if (dur_v) {
        double lo = 1.0 / lim->frame_rate, hi = lim->max_frames / lim->frame_rate;
        if ((rc = take_number(c, dur_v, "duration_s", lo, hi, &dv)) < 0) return rc;
        double f = floor(dv * lim->frame_rate);
        p->max_frames = f < 1 ? 1 : f > lim->max_frames ? lim->max_frames : (int32_t)f;
    }
    /* The minimum length: vLLM's min_tokens, in frames or seconds (rounded up, so the song
     * is at least that long), never past the length cap. */
    json_t *min_frames_v = json_object_get(root, "min_new_tokens");
    json_t *min_dur_v = json_object_get(root, "min_duration_s");
    if (min_frames_v && json_is_null(min_frames_v)) min_frames_v = NULL;
    if (min_dur_v && json_is_null(min_dur_v)) min_dur_v = NULL;
    p->min_frames = 0;
    if (min_frames_v && min_dur_v) {
        snprintf(c->field, c->field_cap, "min_duration_s");
        return mm3_errorf(-EINVAL, "fields 'min_new_tokens' and 'min_duration_s' both set the minimum length: "
                                   "give only one");
    }
    if (min_frames_v) {
        if ((rc = take_int(c, min_frames_v, "min_new_tokens", 0, lim->max_frames, &iv)) < 0) return rc;
        p->min_frames = (int32_t)iv;
    }
    if (min_dur_v) {
        if ((rc = take_number(c, min_dur_v, "min_duration_s", 0, lim->max_frames / lim->frame_rate, &dv)) < 0)
            return rc;
        /* the 1e-9 keeps 30.0 s at 750 frames where 30.0 * 25 lands a hair above */
        double f = ceil(dv * lim->frame_rate - 1e-9);
        p->min_frames = f < 0 ? 0 : f > lim->max_frames ? lim->max_frames : (int32_t)f;
    }
    if (p->min_frames > p->max_frames) {
        const char *name = min_dur_v ? "min_duration_s" : "min_new_tokens";
        char d[160];
        snprintf(d, sizeof d, "%d frames (%.2f s) is more than the length cap of %d frames (%.2f s)", p->min_frames,
                 p->min_frames / lim->frame_rate, p->max_frames, p->max_frames / lim->frame_rate);
        return bad(c, name, "field '%s': %s", d);
    }

    p->seed = lim->default_seed;
    if (GET("seed")) {
        GIVEN(MM3_GIVEN_SEED);
        if ((rc = take_int(c, v, "seed", 0, INT64_MAX, &iv)) < 0) return rc;
        p->seed = (uint64_t)iv;
    }
    p->format = MM3_AUDIO_WAV;
    if (GET("response_format")) {
        const char *s = json_string_value(v);
        if (!s) return bad(c, "response_format", "field '%s': expected a string%s", ": " RESPONSE_FORMATS);
        static const struct {
            const char *name;
            enum mm3_audio_format format;
        } formats[] = {{"wav", MM3_AUDIO_WAV},
                       {"pcm", MM3_AUDIO_PCM},
                       {"flac", MM3_AUDIO_FLAC},
                       {"mp3", MM3_AUDIO_MP3},
                       {"opus", MM3_AUDIO_OPUS}};
        size_t i = 0;
        while (i < sizeof formats / sizeof *formats && strcmp(s, formats[i].name) != 0)
            i++;
        /* aac among them: no Debian 12 main library encodes it well (docs/api.md) */
        if (i == sizeof formats / sizeof *formats)
            return bad(c, "response_format", "field '%s': unsupported format%s: expected " RESPONSE_FORMATS, "");
        p->format = formats[i].format;
    }
    p->sample_rate = lim->default_sample_rate == 32000 ? 32000 : 44100;
    if (GET("sample_rate")) {
        GIVEN(MM3_GIVEN_SAMPLE_RATE);
        if (!json_is_integer(v) || (json_integer_value(v) != 44100 && json_integer_value(v) != 32000))
            return bad(c, "sample_rate", "field '%s': expected 44100 or 32000%s", "");
        p->sample_rate = (int32_t)json_integer_value(v);
    }
    p->num_inference_steps = lim->default_steps;
    if (GET("num_inference_steps")) {
        GIVEN(MM3_GIVEN_STEPS);
        if ((rc = take_int(c, v, "num_inference_steps", 1, 200, &iv)) < 0) return rc;
        p->num_inference_steps = (int32_t)iv;
    }
    p->guidance_scale = lim->default_guidance_scale;
    if (GET("guidance_scale")) {
        GIVEN(MM3_GIVEN_GUIDANCE);
        if ((rc = take_number(c, v, "guidance_scale", 0, 100, &dv)) < 0) return rc;
        p->guidance_scale = (float)dv;
    }
    p->flow_shift = lim->default_flow_shift;
    if (GET("flow_shift")) {
        GIVEN(MM3_GIVEN_FLOW_SHIFT);
        if (!is_number(v)) return bad(c, "flow_shift", "field '%s': expected a number in%s", " (0, 20]");
        dv = json_number_value(v);
        if (!(dv > 0.0 && dv <= 20.0)) return bad(c, "flow_shift", "field '%s': out of range: expected%s", " (0, 20]");
        p->flow_shift = (float)dv;
    }
    p->cfg_scale = lim->default_cfg_scale;
    if (GET("cfg_scale")) {
        GIVEN(MM3_GIVEN_CFG_SCALE);
        if ((rc = take_number(c, v, "cfg_scale", 0, 100, &dv)) < 0) return rc;
        p->cfg_scale = (float)dv;
    }
    p->stream = false;
    if (GET("stream")) {
        if (!json_is_boolean(v)) return bad(c, "stream", "field '%s': expected true or false%s", "");
        p->stream = json_is_true(v);
    }
    p->allow_stall = false;
    if (GET("allow_stall")) {
        if (!json_is_boolean(v)) return bad(c, "allow_stall", "field '%s': expected true or false%s", "");
        p->allow_stall = json_is_true(v);
    }
    p->ignore_eos = false;
    if (GET("ignore_eos")) {
        if (!json_is_boolean(v)) return bad(c, "ignore_eos", "field '%s': expected true or false%s", "");
        p->ignore_eos = json_is_true(v);
    }
    /* OpenAI's and vLLM-Omni's switch: when given it decides, whatever `stream` says. */
    p->sse = false;
    if (GET("stream_format")) {
        const char *s = json_string_value(v);
        if (!s || (strcmp(s, "audio") != 0 && strcmp(s, "sse") != 0))
            return bad(c, "stream_format", "field '%s': expected \"audio\" (raw bytes) or \"sse\"%s",
                       " (OpenAI's speech.audio.* events)");
        p->stream = true;
        p->sse = strcmp(s, "sse") == 0;
    }
    if ((rc = take_lora(c, root, p)) < 0) return rc;
    if (GET("speed")) {
        if (!is_number(v) || json_number_value(v) != 1.0)
            return bad(c, "speed", "field '%s': only 1.0 is supported%s", "");
    }
    /* Testing aid only: a server-side file path from the client, so it must be opted into. */
    if (GET("x_replay_file")) {
        const char *allow = getenv("MM3_ALLOW_REPLAY");
        if (!allow || strcmp(allow, "1") != 0)
            return bad(c, "x_replay_file", "field '%s' is not enabled%s",
                       " (a testing aid: the operator must set MM3_ALLOW_REPLAY=1)");
        const char *s = json_string_value(v);
        if (!s || !s[0]) return bad(c, "x_replay_file", "field '%s': expected a non-empty path%s", "");
        /* refused here, before any work, when it is not a regular file inside api.replay_dir */
        int fd = replay_file_open(c->lim->replay_dir, s);
        if (fd < 0) {
            snprintf(c->field, c->field_cap, "x_replay_file");
            return fd == -ENOMEM ? fd : -EINVAL;
        }
        close(fd);
        if (!(p->replay_file = strdup(s))) return mm3_errorf(-ENOMEM, "out of memory");
    }
#undef GIVEN
#undef GET
    return 0;
}

/* Valid JSON with an integer past 64 bits (a seed >= 2^63) is an out-of-range value,
 * not a syntax error: find the top-level field that holds it. False when there is none
 * (the big number is nested, or the body is bad elsewhere). */
static bool overflowed_field(const char *body, size_t len, char *field, size_t field_cap)
{
    json_t *root = json_loadb(body, len, JSON_REJECT_DUPLICATES | JSON_DECODE_INT_AS_REAL, NULL);
    const char *key;
    json_t *v;
    bool found = false;
    if (json_is_object(root)) json_object_foreach(root, key, v)
        {
            /* 2^63: every integer jansson could not hold is at least this large */
            if (!found && json_is_real(v) && fabs(json_real_value(v)) >= 9223372036854775808.0) {
                snprintf(field, field_cap, "%s", key);
                found = true;
            }
        }
    json_decref(root);
    return found;
}

int api_request_parse(const char *body, size_t len, const struct api_limits *lim, struct mm3_job_params *out,
                      char *field, size_t field_cap)
{
    memset(out, 0, sizeof *out);
    struct parse_ctx c = {lim, field, field_cap};
    if (field_cap) field[0] = 0;
    json_error_t jerr;
    json_t *root = json_loadb(body, len, JSON_REJECT_DUPLICATES, &jerr);
    if (!root && json_error_code(&jerr) == json_error_numeric_overflow && overflowed_field(body, len, field, field_cap))
        return mm3_errorf(-EINVAL, "field '%s': out of range: expected an integer in %s", field,
                          strcmp(field, "seed") == 0 ? "0..9223372036854775807" : "64 bits");
    if (!root) {
        snprintf(field, field_cap, "body");
        return mm3_errorf(-EINVAL, "body: invalid JSON at line %d, column %d (byte %d): %s", jerr.line, jerr.column,
                          jerr.position, jerr.text);
    }
    int rc;
    if (!json_is_object(root)) {
        snprintf(field, field_cap, "body");
        rc = mm3_errorf(-EINVAL, "body: expected a JSON object");
    } else {
        rc = parse_fields(&c, root, out);
    }
    json_decref(root);
    if (rc < 0) mm3_job_params_free(out);
    return rc;
}
