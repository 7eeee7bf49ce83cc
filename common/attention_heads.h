/* The heads of an attention, one description for the CPU op (op_attention) and the GPU
 * kernels (cuda_ops_attention_decode and stage 0's attention kernels) alike. */
#ifndef MM3_ATTENTION_HEADS_H
#define MM3_ATTENTION_HEADS_H

/* n_heads query heads of head_dim values; query head h reads kv head
 * h / (n_heads / n_kv_heads) (GQA); scores are q . k * scale. */
struct attention_heads {
    int n_heads, n_kv_heads, head_dim;
    float scale;
};

#endif
