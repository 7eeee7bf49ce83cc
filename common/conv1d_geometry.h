/* The shape of one 1-D convolution, one description for the CPU ops (common/ops_conv.h)
 * and their GPU twins (stage1/cuda/vocoder_cuda_internal.h) alike. */
#ifndef MM3_CONV1D_GEOMETRY_H
#define MM3_CONV1D_GEOMETRY_H

/* One batch item, channels-first: x [c_in, t] -> y [c_out, output length]. A Conv1d
 * reads dilation (its stride is 1); a ConvTranspose1d reads stride (no dilation). */
struct conv1d_geometry {
    int c_in, c_out;
    int t; /* input length: T of a Conv1d, T_in of a ConvTranspose1d */
    int k; /* taps */
    int dilation, stride, pad;
};

#endif
