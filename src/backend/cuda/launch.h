#pragma once
// The narrow host launchers of the cuda backend's kernels, one group per .cu file. Plain C++ (no
// device code, no fmt) so that cuda_ops.cpp, which checks every argument, can call them. Launchers
// take device pointers and sizes the caller has validated; they enqueue on `stream` and return.
#include <cuda_runtime_api.h>

#include <cstdint>

#include "core/dtype.h"
#include "quant/quant.h"

namespace qinfer::cuda {

// Where kernels report a bad index they found in device data (a token id, an expert id); the Ops
// reads it at its next host synchronization and throws. The first report wins.
struct DeviceStatus {
  int32_t code = 0;  // StatusCode
  int32_t index = 0, value = 0, limit = 0;
};
enum StatusCode : int32_t { kStatusOk = 0, kStatusEmbeddingId = 1, kStatusExpertId = 2 };

// A weight matrix [rows, in] as the kernels read it: dense f32|bf16|f16 rows, or MLX-quantized codes
// (u32 [rows, row_words]) with per-group scales [rows, in / group_size] (and affine biases).
struct WeightView {
  bool quantized = false;
  DType dtype = DType::f32;  // dense element type
  const void* data = nullptr;  // the dense matrix, or the codes
  const void* scales = nullptr;
  const void* biases = nullptr;
  DType scale_dtype = DType::f32;  // affine: f32|bf16|f16; fp modes: u8 codes
  quant::Mode mode = quant::Mode::affine;
  int bits = 0, group_size = 0, group_shift = 0;  // group_size = 1 << group_shift
  int64_t rows = 0, in = 0, row_words = 0;
  float scale_factor = 1.0f;  // nvfp4: global_scale / (448·6) when a global scale is stored, else 1
};

// --- linear.cu ---------------------------------------------------------------------------------
// Token counts up to this go through the fused GEMV kernels; more through dequantize + GEMM.
constexpr int64_t kGemvMaxTokens = 8;
// y[t, row] = x[t] · w[row] for t < T ≤ kGemvMaxTokens, f32 accumulation; the kernel (warp per row,
// row tiles, tensor cores) is chosen by format and T.
void launch_gemv(const float* x, int64_t T, const WeightView& w, float* y, bool fast, cudaStream_t stream);
// Matrices that read the same x (q/k/v, gate/up, GDN input projections) as one launch: matrix i's
// rows go to y[i]. A launcher takes all of them or none (false: the caller runs them one by one).
constexpr int kMaxGemvMatrices = 4;
// The residual add and RMSNorm that produce a one-token GEMV's x (add_rms_norm_linear_many /
// _swiglu), folded into it: every block norms the row itself, from residual and delta, as it reads
// x; block 0 writes normed, and the last block to have read the residual stores residual + delta.
struct NormFold {
  float* residual = nullptr;  // null: no fold, x as given
  const float* delta = nullptr;
  const float* weight = nullptr;
  float* normed = nullptr;
  float eps = 0.0f;
  int* arrivals = nullptr;  // an int that is zero, and is left zero
};
struct GemvBatch {
  int count = 0;
  bool fast = false;  // the fast precision: the affine kernel reads x rounded to 16 bits a chunk
  WeightView w[kMaxGemvMatrices];
  float* y[kMaxGemvMatrices] = {};
  NormFold fold;  // affine kernel only: try_launch_gemv_affine takes a batch with a fold or nothing
};
// y[i] = x · w[i]ᵀ for T ≤ kGemvMaxTokens tokens: one launch where a kernel takes the batch, else
// launch_gemv per matrix.
void launch_gemv_batch(const float* x, int64_t T, const GemvBatch& batch, cudaStream_t stream);
// gemv_dense.cu: one token of dense weights of one dtype and width (16-byte aligned x and rows,
// whole 16-byte units per row).
bool try_launch_gemv_dense(const float* x, const GemvBatch& batch, cudaStream_t stream);
// out = silu(x · gateᵀ) · (x · upᵀ) for one token of dense gate and up of one dtype and shape (the
// conditions of gemv_swiglu_fits).
bool gemv_swiglu_fits(const float* x, const WeightView& gate, const WeightView& up);
void launch_gemv_swiglu(const float* x, const WeightView& gate, const WeightView& up, float* out, cudaStream_t stream);
// gemv_affine.cu: one token of MLX affine 4/8-bit weights (groups 32/64/128, f32|bf16|f16 scales).
bool try_launch_gemv_affine(const float* x, const GemvBatch& batch, cudaStream_t stream);
// out = silu(x · gateᵀ) · (x · upᵀ) for one token of affine gate and up of one layout and shape that
// the affine GEMV takes (the conditions of gemv_affine_swiglu_fits).
bool gemv_affine_swiglu_fits(const float* x, const WeightView& gate, const WeightView& up);
void launch_gemv_affine_swiglu(const float* x, const WeightView& gate, const WeightView& up, float* out, bool fast,
                               const NormFold& fold, cudaStream_t stream);
// Whether the affine GEMV folds `fold` into a launch whose first matrix is w: rows of w.in floats,
// each block's threads two to a 16-byte chunk of codes (w.in ≤ 4096 at 4 bits, 2048 at 8), and
// 16-byte aligned vectors.
bool gemv_affine_folds(const NormFold& fold, const WeightView& w);
// moe_experts through the affine GEMV, for decode-sized batches of MLX affine 4/8-bit experts (gate,
// up: [E·I, H] views; down: [E·H, I]): one launch for every slot's silu(gate)·up into act [T·k, I],
// one for every slot's down row into down_rows [T·k, H], then launch_moe_combine. Bad ids are
// reported (kStatusExpertId). False, with nothing launched, where the kernel does not take the
// weights or the batch's x and activations do not fit its shared memory.
bool try_launch_moe_affine(const float* x, int64_t T, int64_t k, int64_t E, const int32_t* ids, const float* weights,
                           const WeightView& gate, const WeightView& up, const WeightView& down, float* act,
                           float* down_rows, float* out, bool fast, DeviceStatus* status, cudaStream_t stream);
// Rows row0 .. row0 + rows of w, each value v (as Weight::row_f32 gives it) as a bf16 pair hi + lo
// (hi = bf16(v), lo = bf16(v − hi); each bf16 [rows, in]): the tensor-core GEMM's weight operands.
// A null lo writes hi alone (the fast precision: one bf16 operand).
void launch_dequantize_rows_bf16_pair(const WeightView& w, int64_t row0, int64_t rows, void* hi, void* lo,
                                      cudaStream_t stream);
// x (n elements) as bf16 pairs hi + lo (hi alone when lo is null).
void launch_to_bf16_pair(const float* x, int64_t n, void* hi, void* lo, cudaStream_t stream);
// out[t, :] = table row ids[t]; a bad id writes zeros and reports kStatusEmbeddingId.
void launch_embedding(const int32_t* ids, int64_t T, const WeightView& table, float* out, DeviceStatus* status,
                      cudaStream_t stream);

// --- norm.cu -----------------------------------------------------------------------------------
// y = x / sqrt(mean(x²) + eps) · w [· silu(z) when z is given]; rows of D, y may alias x.
void launch_rms_norm(const float* x, const float* w, const float* z, float eps, int64_t N, int64_t D, float* y,
                     cudaStream_t stream);
// x += delta, then y = rms_norm(x) · w, the norm over the updated x as stored; y aliases neither.
void launch_add_rms_norm(float* x, const float* delta, const float* w, float eps, int64_t N, int64_t D, float* y,
                         cudaStream_t stream);
// y = scale · x / sqrt(Σx² + eps); y may alias x.
void launch_l2_norm(const float* x, float eps, float scale, int64_t N, int64_t D, float* y, cudaStream_t stream);

// --- elementwise.cu ----------------------------------------------------------------------------
void launch_silu_mul(const float* gate, const float* up, float* out, int64_t n, cudaStream_t stream);
// x[i] *= sigmoid(gate[i / width]) (width 1: elementwise; width D: one gate per row).
void launch_sigmoid_mul(float* x, const float* gate, int64_t n, int64_t width, cudaStream_t stream);
void launch_add(float* x, const float* y, int64_t n, cudaStream_t stream);
void launch_gdn_gates(const float* a, const float* b, const float* A_log, const float* dt_bias, int64_t T, int64_t Hv,
                      float* g, float* beta, cudaStream_t stream);
// Rows of `width` bytes from src (row pitch src_pitch) to dst (dst_pitch): copy_columns on the device.
void launch_copy_2d(const void* src, int64_t src_pitch, void* dst, int64_t dst_pitch, int64_t width, int64_t rows,
                    cudaStream_t stream);

// --- rope.cu -----------------------------------------------------------------------------------
constexpr int kRopeMaxHalf = 256;
// Per-frequency constants computed on the host with HF's f32 arithmetic (rope_frequencies), passed
// by value.
struct RopeTable {
  float inv_freq[kRopeMaxHalf];
  int8_t axis[kRopeMaxHalf];  // position row (0 t, 1 h, 2 w) of each frequency
  float attention_factor;     // multiplies cos and sin (YaRN's; 1 otherwise)
};
void launch_rope(float* x, const int32_t* positions, int64_t T, int64_t heads, int64_t head_dim, int64_t half,
                 const RopeTable& table, cudaStream_t stream);
// Each head of x [T, heads, head_dim] rms_norm'ed with w [head_dim], then rotated as by launch_rope.
void launch_rms_norm_rope(float* x, const float* w, float eps, const int32_t* positions, int64_t T, int64_t heads,
                          int64_t head_dim, int64_t half, const RopeTable& table, cudaStream_t stream);
// One attention layer's KV pool on the device, [rows, kv_heads, head_dim] of K and of V: f32, or bf16
// (the stores round to nearest even; the attention kernels widen to f32 as they load).
struct KvPoolView {
  void* k = nullptr;
  void* v = nullptr;
  bool bf16 = false;
};
// rms_norm_rope of q [T, heads, head_dim] and of k [T, kv_heads, head_dim] in one launch, k's rotated
// heads and v's also written to pool rows dst_rows[t] (kv_store); false when the heads are too long
// for registers (nothing launched).
bool try_launch_rms_norm_rope_store(float* q, float* k, const float* v, const float* q_w, const float* k_w, float eps,
                                    const int32_t* positions, int64_t T, int64_t heads, int64_t kv_heads,
                                    int64_t head_dim, int64_t half, const RopeTable& table, const int32_t* dst_rows,
                                    const KvPoolView& pool, cudaStream_t stream);

// --- attention.cu ------------------------------------------------------------------------------
// Batch layout arrays on the device, built on the host from an AttentionLayout.
struct AttentionArrays {
  const int32_t* cu_seqlens = nullptr;   // [S+1]
  const int32_t* cached = nullptr;       // [S]
  const int32_t* block_table = nullptr;  // [S, max_blocks]
  const int32_t* dst_rows = nullptr;     // [T]: pool row (block · block_size + offset) of each token's key
  const int32_t* tiles = nullptr;        // [num_tiles, 2]: (sequence, first query row) of each query tile
  int64_t num_tiles = 0;
  int32_t max_blocks = 0, block_size = 0;
};
// Query rows per tile of the attention kernel: the rows of one sequence and kv head are its tokens ×
// the query heads of the group, (token, head) in that order.
constexpr int kAttentionTileRows = 32;
void launch_kv_store(const float* k, const float* v, const int32_t* dst_rows, int64_t T, int64_t row_floats,
                     const KvPoolView& pool, cudaStream_t stream);
// Shared memory the attention kernel needs for head_dim, and the most a block may have.
size_t attention_shared_bytes(int64_t head_dim);
size_t attention_max_shared_bytes(int device);
// Causal paged GQA attention; splits > 1 divides each tile's keys among blocks (flash-decoding) and
// needs `partial` scratch of attention_partial_floats(...) floats.
int64_t attention_partial_floats(int64_t splits, int64_t T, int64_t heads, int64_t head_dim);
void launch_attention(const float* q, const KvPoolView& pool, const AttentionArrays& layout,
                      int64_t T, int64_t heads, int64_t kv_heads, int64_t head_dim, float scale, int splits,
                      float* partial, float* out, cudaStream_t stream);
// Decode and speculative verification (every sequence at most kAttentionDecodeMaxTokens tokens,
// 16-byte aligned q, out and pool): flash-decoding with the query rows in registers, head_dim
// 64 / 128 / 256. `layout.tiles` must be cut into attention_decode_tile_rows(head_dim, max_rows)
// rows per tile (max_rows: the most len · group of a sequence; 0: no kernel for head_dim); the
// partial results take attention_partial_floats(splits, ...) floats, splits from
// attention_decode_splits (with max_keys the most keys a sequence may have).
constexpr int64_t kAttentionDecodeMaxTokens = 8;
constexpr int64_t kAttentionDecodeMaxSplits = 128;
int64_t attention_decode_tile_rows(int64_t head_dim, int64_t max_rows);
int attention_decode_splits(int64_t blocks, int64_t max_keys, int sm_count);
// With splits > 1, `arrivals` (num_tiles × kv_heads ints, zero, left zero) lets the last split of
// each tile merge them; null: a second kernel merges.
void launch_attention_decode(const float* q, const KvPoolView& pool, const AttentionArrays& layout,
                             int64_t T, int64_t heads, int64_t kv_heads, int64_t head_dim, int64_t tile_rows,
                             float scale, int splits, float* partial, int* arrivals, float* out, cudaStream_t stream);
// Prefill on the tensor cores (attention_mma.cu): for batches where some sequence has at least
// kAttentionMmaMinRows query rows (len · group) and head_dim has a kernel (tile rows > 0).
// `layout.tiles` must then be cut into attention_mma_tile_rows(head_dim, bf16) rows per tile;
// decode-sized batches stay on launch_attention, whose key splits suit them better.
// bf16: Q, K, V and P rounded to bf16 (fast mode); otherwise TF32 operands (exact mode). The bf16
// kernel may divide each tile's keys among `splits` blocks (a short chunk after a long cached
// prefix fills few tiles), merged by a second kernel from `partial` scratch of
// attention_partial_floats(splits, T, ...) floats; attention_mma_splits says how many.
constexpr int64_t kAttentionMmaMinRows = 64;
int64_t attention_mma_tile_rows(int64_t head_dim, bool bf16);  // 0: no tensor-core kernel for head_dim
size_t attention_mma_shared_bytes(int64_t head_dim, bool bf16);
int attention_mma_splits(int64_t blocks, int64_t max_keys, int sm_count);
void launch_attention_mma(const float* q, const KvPoolView& pool, const AttentionArrays& layout, int64_t T,
                          int64_t heads, int64_t kv_heads, int64_t head_dim, float scale, bool bf16, int splits,
                          float* partial, float* out, cudaStream_t stream);
// Merges key splits' partial results (un-normalised accumulators, then natural-log maxima and sums).
void launch_attention_combine(const float* partial, int splits, int64_t T, int64_t heads, int64_t head_dim,
                              float* out, cudaStream_t stream);

// --- moe.cu ------------------------------------------------------------------------------------
void launch_moe_route(const float* logits, int64_t T, int64_t E, int64_t k, bool renormalize, int32_t* ids,
                      float* weights, cudaStream_t stream);
// act[t·k + j, i] = silu(gate_e(x[t])_i) · up_e(x[t])_i, e = ids[t, j]; then out = Σ_j w · down_e(act).
// gate / up: views of [E·I, H]; down: [E·H, I]. `act` is scratch of T·k·I floats.
void launch_moe_experts(const float* x, int64_t T, int64_t H, int64_t I, int64_t E, int64_t k, const int32_t* ids,
                        const float* weights, const WeightView& gate, const WeightView& up, const WeightView& down,
                        float* act, float* out, DeviceStatus* status, cudaStream_t stream);
// Whether a batch's slots go grouped by expert (launch_moe_experts_grouped) rather than per slot:
// from two tokens, once the slots are at least half the experts (below that few share one, and the
// sort, gather and combine cost more than the rows re-read), and when one slot's row of width H or
// I fits the shared memory a block stages them in.
bool moe_groups_by_expert(int64_t T, int64_t H, int64_t I, int64_t E, int64_t k);
// The scratch bytes launch_moe_experts_grouped's `work` holds.
size_t moe_grouped_rows_bytes(int64_t T, int64_t H, int64_t I, int64_t E, int64_t k);
// launch_moe_experts' result with the slots sorted by expert on the device (nothing read back: a
// recorded step holds it), each expert's rows read once for all of its slots; bad ids are reported
// (kStatusExpertId, the flat slot index) and add nothing.
void launch_moe_experts_grouped(const float* x, int64_t T, int64_t H, int64_t I, int64_t E, int64_t k,
                                const int32_t* ids, const float* weights, const WeightView& gate, const WeightView& up,
                                const WeightView& down, void* work, float* out, DeviceStatus* status,
                                cudaStream_t stream);

// --- moe_grouped.cu: batches of at least kMoeGroupedMinTokens tokens, grouped by expert ----------
// (below it the launch overhead of a GEMM per expert outweighs what the per-token dots re-read).
constexpr int64_t kMoeGroupedMinTokens = 128;
constexpr int64_t kMoeGroupedMaxExperts = 4096;  // the sort keeps a counter per expert in shared memory
// Stable counting sort of the slots s = t·k + j of ids (flat, `slots` of them) by expert, each
// expert's block of rows starting at a multiple of row_align: slot_row[s] = its row (−1 for a bad
// id, reported with flat index index_base + s); meta = [counts E | first rows E | total rows].
// `work` holds moe_sort_work_ints(slots, E) ints.
int64_t moe_sort_work_ints(int64_t slots, int64_t E);
void launch_moe_sort(const int32_t* ids, int64_t slots, int64_t index_base, int64_t E, int64_t row_align,
                     int32_t* work, int32_t* slot_row, int32_t* meta, DeviceStatus* status, cudaStream_t stream);
// x rows as bf16 GEMM operands: expert e's block (f = 2 with pairs, else 1) holds f · padded rows
// from row f · first[e]: slot rows in order (hi), then with pairs the lo rows from row padded; the
// padding rows are zeroed. padded = count rounded up to row_align.
void launch_moe_gather(const float* x, int64_t H, int64_t k, int64_t slots, const int32_t* ids, const int32_t* slot_row,
                       const int32_t* meta, int64_t E, int64_t row_align, bool pairs, void* rows,
                       cudaStream_t stream);
// hi (+ lo when not null) bf16 [rows, I] = silu(gate) · up, gate / up f32 with row stride ld;
// stacked: each is the sum of rows r and rows + r.
void launch_moe_silu_mul(const float* gate, const float* up, int64_t ld, int64_t rows, int64_t I, bool stacked,
                         void* hi, void* lo, cudaStream_t stream);
// out [T, H] = Σ_j weights[t, j] · down_rows[slot_row[t·k + j]], summed in j order (slot_row null:
// row t·k + j).
void launch_moe_combine(const float* down_rows, const int32_t* slot_row, const float* weights, int64_t T, int64_t k,
                        int64_t H, float* out, cudaStream_t stream);

// --- gdn.cu ------------------------------------------------------------------------------------
struct SeqArrays {
  const int32_t* cu_seqlens = nullptr;  // [S+1]
  const int32_t* state_slot = nullptr;  // [S]: the slot each sequence's state is read from
  const int32_t* state_to = nullptr;    // [S]: and written to (its state_slot: in place)
  // [S]: a slot that also gets the state after a sequence's first snapshot_at tokens (-1: none). The
  // delta rule kernels take only snapshots after all of a sequence's tokens (the op splits the others).
  const int32_t* snapshot_at = nullptr;
  const int32_t* snapshot_to = nullptr;
  const int32_t* token_seq = nullptr;   // [T]: the sequence of each token (conv1d only)
  int64_t num_seqs = 0;
};
void launch_conv1d_causal(const float* x, const float* w, const SeqArrays& layout, int64_t T, int64_t C, int64_t K,
                          float* conv_state, float* out, cudaStream_t stream);
// Largest key head dim the recurrent kernel holds in registers.
constexpr int64_t kDeltaMaxDk = 256;
// The token-by-token rule over the sequences listed in `seqs` (device, num_seqs entries).
void launch_delta_rule_recurrent(const float* q, const float* k, const float* v, const float* g, const float* beta,
                                 const SeqArrays& layout, const int32_t* seqs, int64_t num_seqs, int64_t Hk, int64_t Hv,
                                 int64_t Dk, int64_t Dv, float* state, float* out, cudaStream_t stream);
// The chunk-64 WY / UT-transform form over the listed sequences (max_len: the longest) on the tensor
// cores: all chunks' W, U, P at once, then one pass over the chunks per (sequence, value head, 32
// state rows). Key head dims up to kDeltaChunkedMaxDk, within delta_chunked_shared_bytes(Dk) of
// shared memory; `work` holds delta_chunked_work_floats(T, Hv, Dk) floats.
constexpr int64_t kDeltaChunk = 64;
constexpr int64_t kDeltaChunkedMaxDk = 128;
size_t delta_chunked_shared_bytes(int64_t Dk);
int64_t delta_chunked_work_floats(int64_t T, int64_t Hv, int64_t Dk);
void launch_delta_rule_chunked(const float* q, const float* k, const float* v, const float* g, const float* beta,
                               const SeqArrays& layout, const int32_t* seqs, int64_t num_seqs, int64_t max_len,
                               int64_t T, int64_t Hk, int64_t Hv, int64_t Dk, int64_t Dv, float* work, float* state,
                               float* out, cudaStream_t stream);

// --- sample.cu ---------------------------------------------------------------------------------
// One row of a sampling call as the device reads it (sampling.h's parameters; penalties over the
// distinct history ids [penalties_begin, penalties_end) of the call's id/count arrays).
struct DeviceSampleRow {
  double uniform;  // sampling_uniform(seed, step), drawn on the host by its one definition
  float temperature, repetition, presence, frequency;
  float threshold;  // sampling_threshold: candidates are compacted at it where `candidates`
  float top_p, min_p;
  int32_t top_k;  // 0 where off, also where ≥ the vocabulary (as pick_weighted reads it)
  int32_t penalties_begin, penalties_end;
  int32_t candidates;  // top_k, top_p or min_p filter the row
};

constexpr int64_t kSamplingBlockIds = 1024;  // sampling.h's kSamplingBlock
constexpr int kSampleCandidates = 4096;      // the candidates a row keeps on the device

// Device memory of launch_sampling_weigh for S rows of V logits, nb = ceil(V / kSamplingBlockIds):
// work [S, V] f32 (the penalised canonical logits, then the weights), best [S], row_max [S],
// masses [S, nb] f64, passing [S, nb] (weights ≥ threshold per block), candidate_ids /
// candidate_weights [S, kSampleCandidates] (may be null where no row has `candidates`),
// argmax_scratch (argmax_scratch_bytes).
struct SamplingBuffers {
  float* work;
  int32_t* best;
  float* row_max;
  double* masses;
  int32_t* passing;
  int32_t* candidate_ids;
  float* candidate_weights;
  void* argmax_scratch;
};
void launch_sampling_weigh(const float* logits, int64_t S, int64_t V, const DeviceSampleRow* rows,
                           const int32_t* penalty_ids, const int32_t* penalty_counts, const SamplingBuffers& buf,
                           cudaStream_t stream);
// After launch_sampling_weigh: picks[s] = row s's token by sample_rows' definition, or ~best
// (negative; best its argmax) where the host must finish the row with pick_weighted from the whole
// row: a filtered row with more than kSampleCandidates candidates, or whose first threshold
// LeadingCandidates would lower.
void launch_sampling_pick(int64_t S, int64_t V, const DeviceSampleRow* rows, const SamplingBuffers& buf, int32_t* picks,
                          cudaStream_t stream);

// Ops::mask_logits: logits [S, V] rows rows[r] take −inf where allowed [R, ceil(V / 32)] has the id's
// bit clear (the host checked rows).
void launch_mask_logits(float* logits, int64_t V, const int32_t* rows, int64_t R, const uint32_t* allowed,
                        cudaStream_t stream);

// out[s] = the lowest id of the largest logit of row s, NaN never winning (sampling.h's greedy rule).
// scratch: argmax_scratch_bytes(S, V) bytes of device memory.
size_t argmax_scratch_bytes(int64_t S, int64_t V);
void launch_argmax_rows(const float* logits, int64_t S, int64_t V, int32_t* out, void* scratch, cudaStream_t stream);

}  // namespace qinfer::cuda
