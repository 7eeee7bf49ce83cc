/* The tokenizer.json of generated checkpoints: the real pipeline (NFC, Qwen2
 * split regex, ByteLevel, byte-level BPE, added tokens at the release ids) with
 * a small vocabulary learned here from a built-in text. */
#include <ctype.h>
#include <errno.h>
#include <jansson.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/ckpt_gen.h"
#include "common/error.h"
#include "common/log.h"

static const char train_text[] =
    "A warm indie folk ballad with fingerpicked acoustic guitar, soft piano, brushed drums and a gentle male voice.\n"
    "An upbeat synth pop anthem, bright female vocals, punchy bass, 120 bpm, summer night energy.\n"
    "Melancholic lo-fi hip hop with dusty vinyl crackle, mellow keys and a slow swing groove.\n"
    "Cinematic orchestral piece, rising strings, deep brass, choir in the final chorus.\n"
    "[start]\n[intro]\n[verse]\n"
    "The city lights are fading on the river tonight\n"
    "I hold the letters that you never sent, I read them by the light\n"
    "We were running through the rain, we were singing in the dark\n"
    "Every road I travel leads me back to where we start\n"
    "[chorus]\n"
    "So sing it loud, sing it slow, let the morning find us here\n"
    "Hold on to the heart you know, there is nothing left to fear\n"
    "Oh oh oh, the night is young and the stars are near\n"
    "Sing it loud, sing it slow, I will always be right here\n"
    "[verse]\n"
    "There's a song inside the silence and a fire in the cold\n"
    "There's a story in the mountains that the winter never told\n"
    "I'll be waiting at the station when the trains are running late\n"
    "You'll be dancing in the kitchen while the records spin and wait\n"
    "[bridge]\n"
    "And if the world is turning, turning round and round\n"
    "I will find my way to you, I will never lose the sound\n"
    "[chorus]\n"
    "So sing it loud, sing it slow, let the morning find us here\n"
    "Hold on to the heart you know, there is nothing left to fear\n"
    "[outro]\n"
    "Na na na, la la la, the night is over now\n"
    "Café lights and a naïve little tune, señor, we sing along somehow\n"
    "東京の夜, 東京の夜, the neon rain falls down\n"
    "[inst]\n[end]\n"
    "Dreamy shoegaze with washed out guitars and distant vocals. Aggressive metal with double kick drums.\n"
    "Smooth jazz trio: upright bass, brushed snare, and a lyrical piano solo in the second half.\n"
    "Country song about a long highway, a pickup truck and the girl back home, steel guitar and fiddle.\n"
    "Energetic electronic dance track with a driving four on the floor beat, big synth leads and a euphoric drop.\n"
    "Soulful rhythm and blues, smoky female vocals, electric piano, tight horns and a walking bass line.\n"
    "Epic rock ballad with distorted electric guitars, a soaring guitar solo and powerful male vocals.\n"
    "Gentle lullaby with music box, harp and a soft whispering voice, calm and peaceful.\n"
    "[verse]\n"
    "Morning comes and the window is open, the radio is playing our song\n"
    "Coffee cups and the pages of stories, we were dreaming all along\n"
    "Walking home through the streets of the summer, humming melodies we used to know\n"
    "Counting stars on the roof of the building, never wanting to let go\n"
    "[pre-chorus]\n"
    "Turn it up, turn it up, let the music play\n"
    "Turn it up, turn it up, we will dance until the day\n"
    "[chorus]\n"
    "We are golden, we are shining, we are burning like the sun\n"
    "We are flying, we are rising, and the story has begun\n"
    "We are golden, we are shining, every heart becomes as one\n"
    "[verse]\n"
    "Yesterday I was a stranger, today I'm singing with the crowd\n"
    "Tomorrow we'll be strangers, but tonight we're singing loud\n"
    "[chorus]\n"
    "We are golden, we are shining, we are burning like the sun\n"
    "We are flying, we are rising, and the story has begun\n"
    "[outro]\n"
    "Fading, fading, into the morning light, fading into the night\n";

/* GPT-2's byte -> unicode alphabet; ids 0..255 follow its order. */
static void byte_alphabet(int byte_of_id[256], int cp_of_byte[256])
{
    int n = 0, extra = 0, used[256] = {0};
    for (int b = 0; b < 256; b++)
        if ((b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174 && b <= 255)) {
            byte_of_id[n++] = b;
            cp_of_byte[b] = b;
            used[b] = 1;
        }
    for (int b = 0; b < 256; b++)
        if (!used[b]) {
            byte_of_id[n++] = b;
            cp_of_byte[b] = 256 + extra++;
        }
}

static int put_utf8(char *out, int cp)
{
    if (cp < 0x80) {
        out[0] = (char)cp;
        return 1;
    }
    if (cp < 0x800) {
        out[0] = (char)(0xc0 | (cp >> 6));
        out[1] = (char)(0x80 | (cp & 0x3f));
        return 2;
    }
    out[0] = (char)(0xe0 | (cp >> 12));
    out[1] = (char)(0x80 | ((cp >> 6) & 0x3f));
    out[2] = (char)(0x80 | (cp & 0x3f));
    return 3;
}

struct tok {
    uint8_t *bytes;
    int len;
};

struct word {
    int *ids;
    int len;
    int count;
};

static int is_letter(uint8_t b)
{
    return isalpha(b) || b >= 0x80;
}
static int is_space(uint8_t b)
{
    return b == ' ' || b == '\t' || b == '\n' || b == '\r';
}

/* Approximately the Qwen2 split regex: good enough to learn merges, which the
 * real regex then applies within its own pieces. */
static size_t next_piece(const uint8_t *s, size_t i, size_t n)
{
    size_t j = i;
    if (s[j] == '\'' && j + 1 < n && is_letter(s[j + 1]) && !is_letter(j + 2 < n ? s[j + 2] : ' ')) return j + 2;
    if (is_letter(s[j]) || (s[j] != '\r' && s[j] != '\n' && !isdigit(s[j]) && j + 1 < n && is_letter(s[j + 1]))) {
        j++;
        while (j < n && is_letter(s[j]))
            j++;
        return j;
    }
    if (isdigit(s[j])) return j + 1;
    if (!is_space(s[j]) ||
        (s[j] == ' ' && j + 1 < n && !is_space(s[j + 1]) && !is_letter(s[j + 1]) && !isdigit(s[j + 1]))) {
        if (s[j] == ' ') j++;
        while (j < n && !is_space(s[j]) && !is_letter(s[j]) && !isdigit(s[j]))
            j++;
        while (j < n && (s[j] == '\n' || s[j] == '\r'))
            j++;
        return j;
    }
    while (j < n && is_space(s[j]))
        j++;
    if (j < n && j - i > 1 && s[j - 1] == ' ') j--; /* \s+(?!\S): leave one space to lead the next word */
    return j;
}

static json_t *added_token(int id, const char *content)
{
    return json_pack("{s:i,s:s,s:b,s:b,s:b,s:b,s:b}", "id", id, "content", content, "single_word", 0, "lstrip", 0,
                     "rstrip", 0, "normalized", 0, "special", 1);
}

static const struct {
    int id;
    const char *content;
} specials[] = {
    {151643, "<|endoftext|>"},     {151644, "<|im_start|>"},    {151645, "<|im_end|>"},
    {151654, "<|audio_cfg|>"},     {151669, "<|audio_start|>"}, {151670, "<|audio_end|>"},
    {151671, "<|caption_start|>"}, {151672, "<|caption_end|>"}, {151673, "<|lyrics_start|>"},
    {151674, "<|lyrics_end|>"},
};

static const char pipeline_json[] =
    "{\"normalizer\": {\"type\": \"NFC\"},"
    " \"pre_tokenizer\": {\"type\": \"Sequence\", \"pretokenizers\": ["
    "{\"type\": \"Split\", \"pattern\": {\"Regex\": "
    "\"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\\\r\\\\n\\\\p{L}\\\\p{N}]?\\\\p{L}+|\\\\p{N}| "
    "?[^\\\\s\\\\p{L}\\\\p{N}]+[\\\\r\\\\n]*"
    "|\\\\s*[\\\\r\\\\n]+|\\\\s+(?!\\\\S)|\\\\s+\"}, \"behavior\": \"Isolated\", \"invert\": false},"
    " {\"type\": \"ByteLevel\", \"add_prefix_space\": false, \"trim_offsets\": false, \"use_regex\": false}]},"
    " \"decoder\": {\"type\": \"ByteLevel\", \"add_prefix_space\": true, \"trim_offsets\": true, \"use_regex\": true}}";

static char *token_text(const struct tok *t, const int cp_of_byte[256])
{
    char *s = malloc((size_t)t->len * 3 + 1);
    if (!s) return NULL;
    int o = 0;
    for (int i = 0; i < t->len; i++)
        o += put_utf8(s + o, cp_of_byte[t->bytes[i]]);
    s[o] = 0;
    return s;
}

int ckpt_gen_tokenizer_write(const char *path, int n_merges)
{
    int byte_of_id[256], cp_of_byte[256], id_of_byte[256];
    byte_alphabet(byte_of_id, cp_of_byte);
    for (int i = 0; i < 256; i++)
        id_of_byte[byte_of_id[i]] = i;

    int vcap = 256 + n_merges;
    struct tok *vocab = calloc((size_t)vcap, sizeof *vocab);
    int(*merges)[2] = calloc((size_t)(n_merges ? n_merges : 1), sizeof *merges);
    const uint8_t *text = (const uint8_t *)train_text;
    size_t tn = sizeof train_text - 1;
    struct word *words = calloc(tn, sizeof *words);
    int *counts = calloc((size_t)vcap * (size_t)vcap, sizeof *counts);
    int rc = 0, n_words = 0, nv = 256, nm = 0;
    if (!vocab || !merges || !words || !counts) {
        rc = mm3_errorf(-ENOMEM, "%s: out of memory training the tokenizer", path);
        goto out;
    }
    for (int i = 0; i < 256; i++) {
        vocab[i].bytes = malloc(1);
        vocab[i].bytes[0] = (uint8_t)byte_of_id[i];
        vocab[i].len = 1;
    }
    for (size_t i = 0; i < tn;) {
        size_t j = next_piece(text, i, tn);
        int w = 0;
        while (w < n_words) {
            int same = words[w].len == (int)(j - i);
            for (int k = 0; same && k < words[w].len; k++)
                same = words[w].ids[k] == id_of_byte[text[i + (size_t)k]];
            if (same) break;
            w++;
        }
        if (w == n_words) {
            words[w].ids = malloc((j - i) * sizeof(int));
            words[w].len = (int)(j - i);
            for (size_t k = i; k < j; k++)
                words[w].ids[k - i] = id_of_byte[text[k]];
            n_words++;
        }
        words[w].count++;
        i = j;
    }
    while (nm < n_merges) {
        memset(counts, 0, (size_t)nv * (size_t)vcap * sizeof *counts);
        int best_a = -1, best_b = -1, best = 1;
        for (int w = 0; w < n_words; w++)
            for (int k = 0; k + 1 < words[w].len; k++) {
                int a = words[w].ids[k], b = words[w].ids[k + 1];
                int c = counts[a * vcap + b] += words[w].count;
                /* Ties go to the smaller (a, b), so the result never depends on scan order. */
                if (c > best || (c == best && best_a >= 0 && (a < best_a || (a == best_a && b < best_b)))) {
                    best = c;
                    best_a = a;
                    best_b = b;
                }
            }
        if (best_a < 0) break; /* no pair repeats any more */
        struct tok *t = &vocab[nv];
        t->len = vocab[best_a].len + vocab[best_b].len;
        t->bytes = malloc((size_t)t->len);
        memcpy(t->bytes, vocab[best_a].bytes, (size_t)vocab[best_a].len);
        memcpy(t->bytes + vocab[best_a].len, vocab[best_b].bytes, (size_t)vocab[best_b].len);
        merges[nm][0] = best_a;
        merges[nm][1] = best_b;
        for (int w = 0; w < n_words; w++) {
            int o = 0;
            for (int k = 0; k < words[w].len; k++) {
                if (k + 1 < words[w].len && words[w].ids[k] == best_a && words[w].ids[k + 1] == best_b) {
                    words[w].ids[o++] = nv;
                    k++;
                } else {
                    words[w].ids[o++] = words[w].ids[k];
                }
            }
            words[w].len = o;
        }
        nv++;
        nm++;
    }

    json_error_t jerr;
    json_t *pipe = json_loads(pipeline_json, 0, &jerr);
    CHECK(pipe != NULL);
    json_t *root = json_object(), *added = json_array(), *vj = json_object(), *mj = json_array();
    json_object_set_new(root, "version", json_string("1.0"));
    json_object_set_new(root, "truncation", json_null());
    json_object_set_new(root, "padding", json_null());
    for (size_t i = 0; i < sizeof specials / sizeof specials[0]; i++)
        json_array_append_new(added, added_token(specials[i].id, specials[i].content));
    json_object_set_new(root, "added_tokens", added);
    json_object_set(root, "normalizer", json_object_get(pipe, "normalizer"));
    json_object_set(root, "pre_tokenizer", json_object_get(pipe, "pre_tokenizer"));
    json_object_set_new(root, "post_processor", json_null());
    json_object_set(root, "decoder", json_object_get(pipe, "decoder"));
    json_decref(pipe);
    for (int i = 0; i < nv; i++) {
        char *s = token_text(&vocab[i], cp_of_byte);
        json_object_set_new(vj, s, json_integer(i));
        free(s);
    }
    for (size_t i = 0; i < sizeof specials / sizeof specials[0]; i++)
        json_object_set_new(vj, specials[i].content, json_integer(specials[i].id));
    for (int m = 0; m < nm; m++) {
        char *a = token_text(&vocab[merges[m][0]], cp_of_byte), *b = token_text(&vocab[merges[m][1]], cp_of_byte);
        json_array_append_new(mj, json_pack("[s,s]", a, b));
        free(a);
        free(b);
    }
    json_t *model = json_pack("{s:s,s:n,s:n,s:n,s:n,s:b,s:b,s:b}", "type", "BPE", "dropout", "unk_token",
                              "continuing_subword_prefix", "end_of_word_suffix", "fuse_unk", 0, "byte_fallback", 0,
                              "ignore_merges", 0);
    json_object_set_new(model, "vocab", vj);
    json_object_set_new(model, "merges", mj);
    json_object_set_new(root, "model", model);
    if (json_dump_file(root, path, JSON_COMPACT | JSON_PRESERVE_ORDER) != 0)
        rc = mm3_errorf(-EIO, "%s: cannot write", path);
    json_decref(root);
out:
    if (vocab)
        for (int i = 0; i < nv; i++)
            free(vocab[i].bytes);
    if (words)
        for (int w = 0; w < n_words; w++)
            free(words[w].ids);
    free(vocab);
    free(merges);
    free(words);
    free(counts);
    return rc;
}
