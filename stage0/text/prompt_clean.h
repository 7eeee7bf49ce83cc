/* Caption cleaning and lyrics normalisation with the reference's Python `re`
 * semantics (docs/model.md §3.1, §3.2). Thread-safe. */
#ifndef MM3_PROMPT_CLEAN_H
#define MM3_PROMPT_CLEAN_H

/* Caption cleaning and lyrics normalisation (results malloc'ed, UTF-8). Invalid
 * UTF-8 is -EINVAL naming "caption" / "lyrics". */
int prompt_clean_caption(const char *caption, char **out);
int prompt_normalize_lyrics(const char *lyrics, char **out);

#endif
