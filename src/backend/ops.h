#pragma once
// The op set every backend implements with one signature: `ref` (scalar fp32, the oracle), `cpu`
// (AVX2/FMA/F16C, threads) and `cuda`. Activations are f32; weights may be f32, bf16 or f16 (quantized
// formats arrive as further weight dtypes of `linear` / `embedding` / `moe_experts`). All tensors are
// contiguous row-major on the backend's device. Ops that cross tokens take the batch's sequence
// layout (a flat varlen batch: many sequences' tokens concatenated) and choose their algorithm
// (recurrent vs chunked, decode vs prefill) from it.
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "backend/sampling.h"
#include "backend/tensor.h"
#include "quant/quant.h"

namespace qinfer {

class ThreadPool;

// Where each sequence's tokens sit in the flat batch, and its state slot.
struct SeqLayout {
  std::vector<int32_t> cu_seqlens;  // [S+1]: tokens of sequence s are [cu_seqlens[s], cu_seqlens[s+1])
  std::vector<int32_t> state_slot;  // [S]: recurrent-state slot (conv window + delta state) each sequence reads
  // [S] or empty (every sequence in place): the slot each sequence's state is written to. One that
  // differs from state_slot leaves the state it started from untouched there (a checkpoint for free).
  std::vector<int32_t> state_to;
  // [S] each or empty (none): a sequence whose snapshot_to is a slot (not -1) also leaves its state
  // after its first snapshot_at tokens (1 .. its tokens) there: a checkpoint inside a prefill chunk.
  std::vector<int32_t> snapshot_at, snapshot_to;
  int64_t num_seqs() const { return static_cast<int64_t>(cu_seqlens.size()) - 1; }
  int64_t num_tokens() const { return cu_seqlens.empty() ? 0 : cu_seqlens.back(); }
  int32_t target_slot(int64_t s) const { return (state_to.empty() ? state_slot : state_to)[static_cast<size_t>(s)]; }
  // The snapshot slot of sequence s (-1: none) and the tokens before it.
  int32_t snapshot_slot(int64_t s) const { return snapshot_to.empty() ? -1 : snapshot_to[static_cast<size_t>(s)]; }
  int32_t snapshot_tokens(int64_t s) const { return snapshot_at.empty() ? 0 : snapshot_at[static_cast<size_t>(s)]; }
};

// Checks a sequence layout for an op of `tokens` tokens (errors begin with `who`, "cpu conv1d_causal"):
// cu_seqlens runs from 0 to tokens without decreasing; unless `slots` < 0, every sequence has a state
// slot (and a target and a snapshot slot, when given) below `slots`, a snapshot lies within its
// tokens, and no slot is read or written by two sequences (nor a snapshot slot by any other use).
void check_seq_layout(std::string_view who, const SeqLayout& layout, int64_t tokens, int64_t slots);

// Paged attention over one layer's KV pool.
struct AttentionLayout {
  SeqLayout seqs;
  std::vector<int32_t> cached;       // [S]: tokens each sequence had in the cache before this batch
  std::vector<int32_t> block_table;  // [S, max_blocks] row-major: physical block of each logical block
  int32_t max_blocks = 0;
  int32_t block_size = 0;
};

// One attention layer's KV pool: [num_blocks, block_size, kv_heads, head_dim], f32 or bf16
// (Ops::kv_dtype); k and v of one dtype.
struct KvPool {
  Tensor k, v;
};

// YaRN (HF transformers' rope_type "yarn"): frequencies that turn fewer than beta_slow times over the
// original context are divided by factor, those that turn more than beta_fast times are kept, a
// linear ramp blends those between; cos and sin are scaled by the attention factor.
struct YarnParams {
  double factor = 1.0;
  int64_t original_max_positions = 0;
  double beta_fast = 32.0, beta_slow = 1.0;
  // None: HF's default from factor, with mscale / mscale_all_dim when both are nonzero.
  std::optional<double> attention_factor;
  double mscale = 0.0, mscale_all_dim = 0.0;
  bool truncate = true;  // the ramp's ends rounded out to whole dimensions
};

struct RopeParams {
  int64_t rotary_dim = 0;  // the first rotary_dim features of each head rotate (rotate-half pairing)
  double theta = 10000.0;
  // Interleaved MRoPE: frequency i takes its position from axis H if i%3==1 && i<3*section[1], from
  // W if i%3==2 && i<3*section[2], else from T. Empty: every frequency uses positions row 0.
  std::vector<int64_t> mrope_section;
  std::optional<YarnParams> yarn;  // none: plain frequencies
};

// What a rotation needs per frequency i < rotary_dim / 2, computed once on the host for every backend
// with HF's arithmetic: f32 where torch computes in f32, double where it uses Python floats.
struct RopeFrequencies {
  std::vector<float> inv_freq;  // the angle at position p is p · inv_freq[i] (f32)
  std::vector<int8_t> axis;     // position row (0 t, 1 h, 2 w) of each frequency
  float attention_factor = 1.0f;  // multiplies cos and sin (HF's attention_scaling)
};
// Checks params (errors begin with `who`, "cpu rope") and computes its frequencies.
RopeFrequencies rope_frequencies(std::string_view who, const RopeParams& params);

// A weight matrix [..., out, in]: dense (f32|bf16|f16), or MLX-quantized codes with per-group scales
// (quant/quant.h). A dense Tensor converts implicitly, so dense call sites read as before.
struct Weight {
  Tensor dense;  // the matrix, when not quantized
  quant::Layout layout;
  Tensor codes;           // u32 [..., out, in·bits/32]
  Tensor scales, biases;  // [..., out, in/group]: affine scales/biases in a float dtype; fp modes u8 codes
  float global_scale = 0.0f;  // nvfp4's optional global scale (0: none)

  Weight() = default;
  Weight(Tensor t) : dense(std::move(t)) {}  // NOLINT(google-explicit-constructor)
  bool quantized() const { return codes.data != nullptr; }
  std::vector<int64_t> shape() const;  // logical shape [..., out, in]
  int64_t rows() const;                // product of all dims but the last
  // Row r (leading dims flattened) as f32: converted, or dequantized. Host weights only.
  void row_f32(int64_t r, float* out) const;
  // Bytes a pass over the whole matrix reads (codes + scales + biases when quantized).
  uint64_t nbytes() const;
};

enum class GdnAlgorithm { automatic, recurrent, chunked };

class Ops {
 public:
  virtual ~Ops() = default;
  virtual std::string_view name() const = 0;
  virtual Device device() const = 0;
  virtual Tensor alloc(DType dtype, std::vector<int64_t> shape) = 0;  // zero-filled
  // The element type of the KV pools of caches made for this backend: f32, or bf16 (half the bytes a
  // decode step reads, as PyTorch and vLLM keep a bf16 model's cache). kv_store rounds k and v to
  // the pool's dtype (RNE); attention reads either. The cuda backend's fast precision keeps bf16,
  // everything else f32; --kv-cache-dtype chooses.
  DType kv_dtype() const { return kv_dtype_; }
  void set_kv_dtype(DType dtype);  // f32 or bf16
  // Bytes this backend's memory has free, where it has its own (a GPU's); none for host memory.
  virtual std::optional<uint64_t> free_memory() const { return std::nullopt; }
  // For an op's output, which the op writes whole before anyone reads it: a device backend skips
  // the zero fill (a memset per activation of every layer).
  virtual Tensor alloc_output(DType dtype, std::vector<int64_t> shape) { return alloc(dtype, std::move(shape)); }
  // A new tensor holding host bytes given as pieces concatenated in order (a checkpoint tensor's
  // slices of mmapped files): the one path weights take at load. A device backend streams them
  // through pinned buffers, overlapping the host copy of one chunk with the transfer of the last.
  virtual Tensor upload(DType dtype, std::vector<int64_t> shape, std::span<const std::span<const std::byte>> pieces);
  // src → dst (same dtype and element count), each in host memory or in this backend's; a host
  // destination is complete when the call returns. Host backends: a memcpy.
  virtual void copy(const Tensor& src, Tensor& dst);
  // Host memory this backend copies to and from without staging (pinned on a device backend; host
  // backends: host_tensor). Not zeroed.
  virtual Tensor alloc_pinned(DType dtype, std::vector<int64_t> shape);
  // Each pair's copy (first → second), in order with this backend's other work, between its memory
  // and alloc_pinned memory (the prefix cache's host tier). A device backend queues them and returns:
  // a host destination is complete before anything queued after it, and for the host to read once
  // the backend next waits for its device (a read back).
  virtual void copy_many(std::span<const std::pair<Tensor, Tensor>> copies);
  // copy_columns (tensor.h) on tensors in this backend's memory.
  virtual void copy_columns(const Tensor& src, int64_t src_col, Tensor& dst, int64_t dst_col, int64_t width);

  // out[t,:] = table[ids[t],:]. ids i32 [T]; table [V,H] (any Weight: quantized rows dequantize); out f32 [T,H].
  virtual void embedding(const Tensor& ids, const Weight& table, Tensor& out) = 0;
  // y = x · wᵀ. x f32 [T,in]; w [out,in] (dense or quantized); y f32 [T,out].
  virtual void linear(const Tensor& x, const Weight& w, Tensor& y) = 0;
  // ys[i] = x · ws[i]ᵀ for matrices that read the same x (q/k/v, gate/up, GDN input projections;
  // at most 4). A device backend runs a decode step's as one launch; host backends call linear.
  virtual void linear_many(const Tensor& x, const std::vector<const Weight*>& ws, const std::vector<Tensor*>& ys);
  // out = silu(x · gateᵀ) · (x · upᵀ), the SwiGLU MLP's first half. gate, up [I,in] (dense or
  // quantized); out f32 [T,I]. A device backend runs a decode step's as one launch (each block owns
  // rows of both matrices); host backends call linear_many and silu_mul.
  virtual void linear_swiglu(const Tensor& x, const Weight& gate, const Weight& up, Tensor& out);
  // y = x / sqrt(mean(x²) + eps) · w over the last dim D. x, y f32 [N,D] (may alias); w f32 [D].
  virtual void rms_norm(const Tensor& x, const Tensor& w, float eps, Tensor& y) = 0;
  // x += delta, then y = rms_norm(x) · w (the residual add fused with the next pre-norm).
  // x, delta, y f32 [N,D] (y aliases neither); w f32 [D].
  virtual void add_rms_norm(Tensor& x, const Tensor& delta, const Tensor& w, float eps, Tensor& y) = 0;
  // add_rms_norm(x, delta, w, eps, y), then linear_many(y, ws, ys) / linear_swiglu(y, gate, up, out):
  // a layer's residual add and pre-norm with its first projections, which a device backend may run
  // as one launch for a decode step (the GEMV's blocks norming the row as they read it); the
  // defaults call the two ops.
  virtual void add_rms_norm_linear_many(Tensor& x, const Tensor& delta, const Tensor& w, float eps, Tensor& y,
                                        const std::vector<const Weight*>& ws, const std::vector<Tensor*>& ys);
  virtual void add_rms_norm_linear_swiglu(Tensor& x, const Tensor& delta, const Tensor& w, float eps, Tensor& y,
                                          const Weight& gate, const Weight& up, Tensor& out);
  // y = rms_norm(x, w) · silu(z). x, z, y f32 [N,D]; w f32 [D].
  virtual void rms_norm_gated(const Tensor& x, const Tensor& z, const Tensor& w, float eps, Tensor& y) = 0;
  // y = scale · x / sqrt(Σx² + eps) over the last dim. x, y f32 [N,D] (may alias).
  virtual void l2_norm(const Tensor& x, float eps, float scale, Tensor& y) = 0;
  // In place on x f32 [T, heads, head_dim]; positions i32 [3, T] (rows t, h, w; equal for text).
  virtual void rope(Tensor& x, const Tensor& positions, const RopeParams& params) = 0;
  // In place on x f32 [T, heads, head_dim]: each head's vector rms_norm'ed over head_dim with w f32
  // [head_dim], then rotated as by `rope` (the per-head q/k norm fused with the rotation).
  virtual void rms_norm_rope(Tensor& x, const Tensor& w, float eps, const Tensor& positions,
                             const RopeParams& params) = 0;
  // out = silu(gate) · up. All f32, same shape (out may alias either).
  virtual void silu_mul(const Tensor& gate, const Tensor& up, Tensor& out) = 0;
  // x = x · sigmoid(gate). gate has x's shape, or [N,1] for x [N,D] (one gate per row, broadcast:
  // the MoE shared-expert gate).
  virtual void sigmoid_mul(Tensor& x, const Tensor& gate) = 0;
  // x += y. Same shape.
  virtual void add(Tensor& x, const Tensor& y) = 0;

  // The attention inputs of a batch in one pass: rms_norm_rope of q with q_w and of k with k_w, then
  // kv_store of k and v. A device backend fuses them; host backends call the three ops.
  virtual void rms_norm_rope_store(Tensor& q, Tensor& k, const Tensor& v, const Tensor& q_w, const Tensor& k_w,
                                   float eps, const Tensor& positions, const RopeParams& params,
                                   const AttentionLayout& layout, KvPool& pool);
  // Writes this batch's keys / values into the pool at each token's cache position
  // (cached[s] + index within the sequence). k, v f32 [T, kv_heads, head_dim].
  virtual void kv_store(const Tensor& k, const Tensor& v, const AttentionLayout& layout, KvPool& pool) = 0;
  // Causal GQA attention of each token over its sequence's cached keys plus the batch's keys up to
  // itself (already stored by kv_store). q f32 [T, heads, head_dim]; out f32 [T, heads, head_dim].
  virtual void attention(const Tensor& q, const KvPool& pool, const AttentionLayout& layout, float scale,
                         Tensor& out) = 0;

  // Softmax over E experts (fp32), top-k, optional renormalization of the k weights.
  // logits f32 [T,E]; ids i32 [T,k]; weights f32 [T,k] (k = ids.dim(1)).
  virtual void moe_route(const Tensor& logits, bool renormalize, Tensor& ids, Tensor& weights) = 0;
  // out[t] = Σ_j weights[t,j] · down_e(silu(gate_e(x[t])) · up_e(x[t])), e = ids[t,j].
  // x f32 [T,H]; gate, up [E,I,H]; down [E,H,I] (f32|bf16|f16); out f32 [T,H] (overwritten).
  virtual void moe_experts(const Tensor& x, const Tensor& ids, const Tensor& weights, const Weight& gate,
                           const Weight& up, const Weight& down, Tensor& out) = 0;

  // Gated DeltaNet gates: beta = sigmoid(b); g = −exp(A_log) · softplus(a + dt_bias) (log decay).
  // a, b, g, beta f32 [T,Hv]; A_log, dt_bias f32 [Hv].
  virtual void gdn_gates(const Tensor& a, const Tensor& b, const Tensor& A_log, const Tensor& dt_bias, Tensor& g,
                         Tensor& beta) = 0;
  // Causal depthwise conv1d with SiLU, per sequence, continuing from each sequence's window:
  // out[t,c] = silu(Σ_j w[c,j] · in[t-K+1+j, c]) where frames before the sequence's first token come
  // from conv_state[slot] ([K-1, C], oldest first). Afterwards conv_state[target slot] holds the last
  // K-1 input frames (and a snapshot slot those before its snapshot). x, out f32 [T,C]; w f32 [C,K];
  // conv_state f32 [slots, K-1, C].
  virtual void conv1d_causal(const Tensor& x, const Tensor& w, const SeqLayout& layout, Tensor& conv_state,
                             Tensor& out) = 0;
  // Gated delta rule per sequence from its state slot; value head h reads key head h / (Hv/Hk).
  // For each token: S = exp(g)·S; δ = β·(v − S·k); S += δ ⊗ k; o = S·q.
  // q, k f32 [T,Hk,Dk] (already l2-normed, q scaled); v f32 [T,Hv,Dv]; g (log decay), beta f32 [T,Hv];
  // state f32 [slots, Hv, Dv, Dk] (S[i,j]: i over Dv, j over Dk), read from each sequence's slot and
  // written to its target slot (and, after its first snapshot_at tokens, to its snapshot slot); out f32
  // [T,Hv,Dv].
  // `algorithm` automatic lets the backend choose per sequence (chunked for long ones); tests force
  // recurrent or the chunk-64 WY form, which must agree.
  virtual void gated_delta_rule(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& g,
                                const Tensor& beta, const SeqLayout& layout, Tensor& state, Tensor& out,
                                GdnAlgorithm algorithm) = 0;

  // Recorded steps. Model::forward brackets a step whose shape repeats (decode) with
  // begin_step(key) ... end_step(output); `key` names everything that shapes the step's launches.
  // A backend that can record queued work (CUDA graphs) records a key's step once it repeats and
  // afterwards replays it: the ops of a replayed step only stage their host-side inputs (ids,
  // positions, layouts), and end_step runs the recording. end_step returns the step's output, valid
  // until the next step. abort_step ends a step that threw. Host backends run every step as is.
  virtual void begin_step(const std::string& key) { (void)key; }
  virtual Tensor end_step(Tensor output) { return output; }
  virtual void abort_step() {}
  // Whether begin_step / end_step record and replay (a GPU with graphs on); host backends run as is.
  virtual bool records_steps() const { return false; }

  // A stopwatch of the device's time on a step: begin_device_timing() before the step's first op,
  // end_device_timing() once the host has the step's results (after sample); it returns the seconds
  // from the step's first work on the device to its last, or none on a host backend (whose device
  // time is the host's).
  virtual void begin_device_timing() {}
  virtual std::optional<double> end_device_timing() { return std::nullopt; }

  // Picks one token per row of logits f32 [S,V] (see backend/sampling.h for the exact semantics, which
  // every backend shares). history[s] holds row s's prompt + generated ids, for the penalties.
  virtual void sample(const Tensor& logits, const std::vector<SamplingParams>& params,
                      const std::vector<std::vector<int32_t>>& history, const std::vector<uint64_t>& step,
                      std::vector<int32_t>& out) = 0;
  // Constrained decoding, before sample: in logits f32 [S, V], row rows[r] (i32 [R], distinct, in
  // [0, S)) keeps the logits whose ids have their bit set in allowed u32 [R, ceil(V / 32)] (id v: bit
  // v % 32 of word v / 32); the others become −inf. (mask_logits_rows in backend/sampling.h.)
  virtual void mask_logits(Tensor& logits, const Tensor& rows, const Tensor& allowed) = 0;

 protected:
  DType kv_dtype_ = DType::f32;
};

// `host` in ops' memory: the tensor itself when ops works in host memory, else a copy.
Tensor to_backend(Ops& ops, const Tensor& host);
// `t` in host memory: the tensor itself when it is there, else a copy made through ops.
Tensor to_host(Ops& ops, const Tensor& t);

std::unique_ptr<Ops> make_ref_ops();
std::unique_ptr<Ops> make_cpu_ops(ThreadPool& pool);

}  // namespace qinfer
