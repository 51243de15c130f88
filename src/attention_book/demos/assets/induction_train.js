// Chapter 15's training, in the page: the attention-only TinyGPT, the repeated-segment task,
// train_on_repeats (AdamW, the learning rate falling linearly to 0) and the head scores of
// attention_book.heads, written out in plain JavaScript with the backward pass by hand.
//
// inductionEngine() returns the pieces; it reads nothing outside itself (no page, no `data`),
// so the demo runs it in a Web Worker (its source text travels there whole) and the tests run
// it in Node.js too. The Python side, attention_book.demos.induction, is the reference; each
// function here names the PyTorch code it repeats:
//
//   TorchGenerator             torch.Generator().manual_seed(seed) on the CPU: the same
//                              Mersenne Twister, so randint and rand give torch's numbers
//   repeatedSegments           attention_book.repeat_task.repeated_segments
//   initialParameters          torch.manual_seed(seed); TinyGPT(32, 32, 2, 2, 32,
//                              attention_only=True, rope=..., dtype=torch.float64)
//   createModel                TinyGPT.forward, repeat_loss, and their backward pass
//   createTrainer(...)         train_on_repeats, a step at a time: trainStep() draws a fresh
//     .trainStep()             batch, takes repeat_loss's gradient and makes the step of
//                              torch.optim.AdamW with LambdaLR(1 - step / steps); record() is
//     .record()                what train_on_repeats records on the probe: the loss, the
//                              accuracy, previous_token_scores (at the induction targets) and
//                              induction_scores; attention(tokens) is each layer's weights
//
// Numbers are JavaScript's doubles, the float64 of the chapter. Arrays are flat and
// row-major: a (B, T, d_model) activation is a Float64Array of B * T * d_model numbers, a
// Linear's weight (out, in) as PyTorch stores it.
/* exported inductionEngine */

function inductionEngine() {
  "use strict";

  // ---------------------------------------------------------------------------------------
  // torch's CPU generator: MT19937 seeded as at::mt19937 does, and the three draws chapter 15
  // needs: randint (a 32-bit draw modulo the range), rand in float64 (53 bits of a 64-bit
  // draw made of two 32-bit ones, the first one high) and normal_ (Box-Muller on 16 numbers
  // at a time, as at::native's normal_fill does for a float64 tensor of 16 or more).
  class TorchGenerator {
    constructor(seed) {
      if (!Number.isInteger(seed) || seed < 0 || seed > 0xffffffff) {
        throw new RangeError(`seed must be an integer from 0 to ${0xffffffff}, got ${seed}`);
      }
      const state = new Uint32Array(624);
      state[0] = seed >>> 0;
      for (let j = 1; j < 624; j++) {
        const previous = state[j - 1] ^ (state[j - 1] >>> 30);
        state[j] = (Math.imul(1812433253, previous) + j) >>> 0;
      }
      this.state = state;
      this.left = 1;
      this.next = 0;
    }
    nextState() {
      const s = this.state;
      const twist = (u, v) => ((((u & 0x80000000) | (v & 0x7fffffff)) >>> 1) ^
                               ((v & 1) ? 0x9908b0df : 0));
      let p = 0;
      for (; p < 624 - 397; p++) { s[p] = s[p + 397] ^ twist(s[p], s[p + 1]); }
      for (; p < 623; p++) { s[p] = s[p + 397 - 624] ^ twist(s[p], s[p + 1]); }
      s[623] = s[396] ^ twist(s[623], s[0]);
      this.left = 624;
      this.next = 0;
    }
    random32() {
      if (--this.left === 0) { this.nextState(); }
      let y = this.state[this.next++];
      y ^= y >>> 11;
      y ^= (y << 7) & 0x9d2c5680;
      y ^= (y << 15) & 0xefc60000;
      y ^= y >>> 18;
      return y >>> 0;
    }
    randint(low, high) {  // torch.randint(low, high, ...): one number in [low, high)
      return low + (this.random32() % (high - low));
    }
    rand() {  // torch.rand(..., dtype=torch.float64): one number in [0, 1)
      const high = this.random32() & 0x1fffff;  // the low 21 bits of the first draw ...
      const low = this.random32();  // ... and the 32 of the second: 53 bits
      return (high * 4294967296 + low) / 9007199254740992;
    }
    uniform(from, to) {  // tensor.uniform_(from, to) in float64: x * (to - from) + from, fused
      const value = fusedMultiplyAdd(this.rand(), to - from, from);
      return value === to ? from : value;
    }
    normalFill(out) {  // tensor.normal_() on a contiguous float64 tensor of 16 or more numbers
      const n = out.length;
      for (let i = 0; i < n; i++) { out[i] = this.rand(); }
      const fill16 = start => {
        for (let j = 0; j < 8; j++) {
          const u1 = 1 - out[start + j];
          const u2 = out[start + j + 8];
          const radius = Math.sqrt(-2 * Math.log(u1));
          const theta = 2 * Math.PI * u2;
          out[start + j] = radius * Math.cos(theta);
          out[start + j + 8] = radius * Math.sin(theta);
        }
      };
      for (let i = 0; i < n - 15; i += 16) { fill16(i); }
      if (n % 16 !== 0) {  // the last 16 numbers are drawn again
        for (let i = n - 16; i < n; i++) { out[i] = this.rand(); }
        fill16(n - 16);
      }
    }
  }

  // a * b + c rounded once, as the C++ compiler's fused multiply-add computes it in
  // torch's uniform_ (a plain a * b + c differs in the last bit for about half the numbers).
  // Exact: the three doubles become integers times powers of two, summed as BigInts, and
  // Number() rounds the sum to the nearest double (ties to even).
  const bits = new DataView(new ArrayBuffer(8));
  function asInteger(x) {  // x = mantissa * 2^exponent, both integers
    bits.setFloat64(0, x);
    const high = bits.getUint32(0), low = bits.getUint32(4);
    const biased = (high >>> 20) & 0x7ff;
    let mantissa = (BigInt(high & 0xfffff) << 32n) | BigInt(low);
    if (biased !== 0) { mantissa |= 1n << 52n; }
    const exponent = (biased === 0 ? 1 : biased) - 1075;
    return [high >>> 31 ? -mantissa : mantissa, exponent];
  }
  function fusedMultiplyAdd(a, b, c) {
    const [ma, ea] = asInteger(a), [mb, eb] = asInteger(b), [mc, ec] = asInteger(c);
    const product = ma * mb, ep = ea + eb;
    const e = Math.min(ep, ec);
    const sum = (product << BigInt(ep - e)) + (mc << BigInt(ec - e));
    return Number(sum) * Math.pow(2, e);
  }

  // ---------------------------------------------------------------------------------------
  // The task (repeat_task.repeated_segments): tokens (B, T), then the offsets (B,) unless
  // fixed, then the first starts (B,) from rand, in that order, as torch draws them.
  function repeatedSegments(generator, batchSize, seqLen, segmentLen, vocabSize, offset) {
    if (2 * segmentLen > seqLen) {
      throw new RangeError(`two copies of segmentLen=${segmentLen} do not fit in seqLen=${seqLen}`);
    }
    if (offset !== null && (offset < segmentLen || offset + segmentLen > seqLen)) {
      throw new RangeError(`offset ${offset} must lie in ${segmentLen} ... ${seqLen - segmentLen}`);
    }
    const tokens = new Int32Array(batchSize * seqLen);  // (B, T)
    for (let i = 0; i < tokens.length; i++) { tokens[i] = generator.randint(0, vocabSize); }
    const offsets = new Int32Array(batchSize);  // (B,)
    for (let b = 0; b < batchSize; b++) {
      offsets[b] = offset === null ? generator.randint(segmentLen, seqLen - segmentLen + 1) : offset;
    }
    const firstStart = new Int32Array(batchSize);
    const secondStart = new Int32Array(batchSize);
    const lossMask = new Uint8Array(batchSize * seqLen);  // (B, T)
    for (let b = 0; b < batchSize; b++) {
      const room = seqLen - segmentLen - offsets[b] + 1;  // where both copies fit
      firstStart[b] = Math.floor(generator.rand() * room);
      secondStart[b] = firstStart[b] + offsets[b];
      for (let j = 0; j < segmentLen; j++) {
        tokens[b * seqLen + secondStart[b] + j] = tokens[b * seqLen + firstStart[b] + j];
      }
      // True where the next token is the copy's 2nd ... last: the loss is taken there.
      for (let j = 0; j < segmentLen - 1; j++) { lossMask[b * seqLen + secondStart[b] + j] = 1; }
    }
    return {tokens, lossMask, firstStart, secondStart, batchSize, seqLen};
  }

  // ---------------------------------------------------------------------------------------
  // The parameters of TinyGPT(attention_only=True), in the order of its state_dict.
  function parameterShapes(config) {
    const {vocabSize: V, dModel: d, numLayers, contextLength: T, rope} = config;
    const shapes = [["token_embedding.weight", [V, d]]];
    if (!rope) { shapes.push(["position_embedding.weight", [T, d]]); }
    for (let l = 0; l < numLayers; l++) {
      const p = `blocks.${l}.`;
      shapes.push([`${p}attention_norm.weight`, [d]], [`${p}attention_norm.bias`, [d]],
                  [`${p}attention.W_query.weight`, [d, d]], [`${p}attention.W_key.weight`, [d, d]],
                  [`${p}attention.W_value.weight`, [d, d]],
                  [`${p}attention.out_proj.weight`, [d, d]], [`${p}attention.out_proj.bias`, [d]]);
    }
    shapes.push(["final_norm.weight", [d]], ["final_norm.bias", [d]], ["output.weight", [V, d]]);
    return shapes;
  }

  function zeros(config) {
    const params = {};
    for (const [name, shape] of parameterShapes(config)) {
      params[name] = new Float64Array(shape.reduce((a, b) => a * b, 1));
    }
    return params;
  }

  // torch.manual_seed(seed), then the model is built: the embeddings drawn from N(0, 1)
  // (nn.Embedding), every Linear's weight from U(-1/sqrt(in), 1/sqrt(in)) (kaiming_uniform_
  // with a = sqrt(5)) and its bias likewise, the LayerNorms 1 and 0; in construction order.
  function initialParameters(config, seed) {
    const generator = new TorchGenerator(seed);
    const params = zeros(config);
    const d = config.dModel;
    // init.calculate_gain("leaky_relu", sqrt(5)), then bound = sqrt(3) * gain / sqrt(fan_in)
    const gain = Math.sqrt(2.0 / (1 + Math.sqrt(5) ** 2));
    const weightBound = Math.sqrt(3.0) * (gain / Math.sqrt(d));
    const biasBound = 1 / Math.sqrt(d);
    const uniform = (array, bound) => {
      for (let i = 0; i < array.length; i++) { array[i] = generator.uniform(-bound, bound); }
    };
    for (const [name] of parameterShapes(config)) {
      const array = params[name];
      if (name.endsWith("embedding.weight")) {
        generator.normalFill(array);
      } else if (name.endsWith("norm.weight")) {
        array.fill(1);
      } else if (name.endsWith("norm.bias")) {
        array.fill(0);
      } else if (name.endsWith("bias")) {
        uniform(array, biasBound);
      } else {
        uniform(array, weightBound);
      }
    }
    return params;
  }

  // ---------------------------------------------------------------------------------------
  // The model: forward and backward for a batch of sequences of length seqLen.

  // A zeroed array of `size` numbers, the same memory each time (name, size) is asked for: a
  // step needs some forty arrays of up to half a megabyte, and making them afresh every step
  // costs more than zeroing them. What a forward pass keeps for its backward pass lives here
  // until the next forward pass of the same size.
  const workspace = new Map();
  function scratch(name, size) {
    const key = `${name}:${size}`;
    let array = workspace.get(key);
    if (array === undefined) {
      array = new Float64Array(size);
      workspace.set(key, array);
    } else {
      array.fill(0);
    }
    return array;
  }

  // c[r, j] = a[r] . b[j] (+= with `accumulate`): the rows r of a that `rows` lists (null:
  // all m of them) times every row j < n of b, each row k numbers long; row r of c is
  // c[r * n ... r * n + n - 1]. The product of two rows of a with four of b at a time: each
  // number read serves several products, and eight running sums overlap their additions.
  // That is what makes training fast enough to watch (2 to 3 times faster than one dot
  // product after another).
  //
  // `causal` skips what is known to be zero in causal attention, where rows are queries
  // (ascending) and columns keys: 1, only the columns j <= r (a few more, up to a multiple of
  // 4, which the caller ignores); 2, only the terms p <= r (a[r, p] is 0 beyond); 3, only the
  // terms p >= r (a[r, p] is 0 before).
  function matmulNT(a, rows, m, b, n, k, c, accumulate, causal = 0) {
    const count = rows === null ? m : rows.length;
    const n4 = n - (n % 4);
    for (let index = 0; index < count; index += 2) {
      const r0 = rows === null ? index : rows[index];
      const pair = index + 1 < count;
      const r1 = pair ? (rows === null ? index + 1 : rows[index + 1]) : r0;
      const x0 = r0 * k, x1 = r1 * k, c0 = r0 * n, c1 = r1 * n;
      const jEnd = causal === 1 ? Math.min(n4, (r1 + 4) & ~3) : n4;
      const pStart = causal === 3 ? r0 : 0, pEnd = causal === 2 ? Math.min(k, r1 + 1) : k;
      for (let j = 0; j < jEnd; j += 4) {
        const w0 = j * k, w1 = w0 + k, w2 = w1 + k, w3 = w2 + k;
        let s00 = 0, s01 = 0, s02 = 0, s03 = 0, s10 = 0, s11 = 0, s12 = 0, s13 = 0;
        for (let p = pStart; p < pEnd; p++) {
          const u0 = a[x0 + p], u1 = a[x1 + p];
          const v0 = b[w0 + p], v1 = b[w1 + p], v2 = b[w2 + p], v3 = b[w3 + p];
          s00 += u0 * v0; s01 += u0 * v1; s02 += u0 * v2; s03 += u0 * v3;
          s10 += u1 * v0; s11 += u1 * v1; s12 += u1 * v2; s13 += u1 * v3;
        }
        if (accumulate) {
          c[c0 + j] += s00; c[c0 + j + 1] += s01; c[c0 + j + 2] += s02; c[c0 + j + 3] += s03;
          if (pair) { c[c1 + j] += s10; c[c1 + j + 1] += s11; c[c1 + j + 2] += s12; c[c1 + j + 3] += s13; }
        } else {
          c[c0 + j] = s00; c[c0 + j + 1] = s01; c[c0 + j + 2] = s02; c[c0 + j + 3] = s03;
          if (pair) { c[c1 + j] = s10; c[c1 + j + 1] = s11; c[c1 + j + 2] = s12; c[c1 + j + 3] = s13; }
        }
      }
      for (let j = n4; j < (causal === 1 ? Math.min(n, r1 + 1) : n); j++) {  // n % 4 more rows of b
        let s0 = 0, s1 = 0;
        for (let p = pStart; p < pEnd; p++) {
          s0 += a[x0 + p] * b[j * k + p];
          s1 += a[x1 + p] * b[j * k + p];
        }
        c[c0 + j] = accumulate ? c[c0 + j] + s0 : s0;
        if (pair) { c[c1 + j] = accumulate ? c[c1 + j] + s1 : s1; }
      }
    }
  }

  // The rows `rows` (a list of row indices, or null for all numRows) of x (numRows, k),
  // transposed: (k, n).
  function gatherTransposed(name, x, numRows, k, rows) {
    const n = rows === null ? numRows : rows.length;
    const out = scratch(name, k * n);
    for (let a = 0; a < n; a++) {
      const r = rows === null ? a : rows[a];
      for (let i = 0; i < k; i++) { out[i * n + a] = x[r * k + i]; }
    }
    return out;
  }

  // y = x W^T + bias (a Linear with weight W of shape (out, in)), for the listed rows of x.
  function linear(x, W, bias, y, numRows, dIn, dOut, rows) {
    matmulNT(x, rows, numRows, W, dOut, dIn, y, false);
    if (bias === null) { return; }
    const n = rows === null ? numRows : rows.length;
    for (let a = 0; a < n; a++) {
      const r = rows === null ? a : rows[a];
      for (let o = 0; o < dOut; o++) { y[r * dOut + o] += bias[o]; }
    }
  }

  // The gradients of linear, for the listed rows: dW = dy^T x and dBias = the sum of dy's rows
  // (set, not added), and dx += dy W when dx is given.
  function linearBackward(x, W, dy, dW, dBias, dx, numRows, dIn, dOut, rows) {
    const n = rows === null ? numRows : rows.length;
    const dyT = gatherTransposed("dyT", dy, numRows, dOut, rows);  // (out, n)
    matmulNT(dyT, null, dOut, gatherTransposed("xT", x, numRows, dIn, rows), dIn, n, dW, false);
    if (dBias !== null) {
      for (let o = 0; o < dOut; o++) {
        let sum = 0;
        for (let a = 0; a < n; a++) { sum += dyT[o * n + a]; }
        dBias[o] = sum;
      }
    }
    if (dx !== null) {
      matmulNT(dy, rows, numRows, gatherTransposed("WT", W, dOut, dIn, null), dIn, dOut, dx, true);
    }
  }

  const LN_EPS = 1e-5;  // nn.LayerNorm's eps

  // LayerNorm of the listed rows of x (numRows, d); keeps the normalised rows and 1 / std.
  function layerNorm(x, weight, bias, y, xhat, rstd, numRows, d, rows) {
    const n = rows === null ? numRows : rows.length;
    for (let a = 0; a < n; a++) {
      const r = rows === null ? a : rows[a];
      const o = r * d;
      let mean = 0;
      for (let i = 0; i < d; i++) { mean += x[o + i]; }
      mean /= d;
      let variance = 0;  // biased, as LayerNorm's
      for (let i = 0; i < d; i++) { const c = x[o + i] - mean; variance += c * c; }
      variance /= d;
      const inv = 1 / Math.sqrt(variance + LN_EPS);
      rstd[r] = inv;
      for (let i = 0; i < d; i++) {
        const normalised = (x[o + i] - mean) * inv;
        xhat[o + i] = normalised;
        y[o + i] = normalised * weight[i] + bias[i];
      }
    }
  }

  // LayerNorm's backward for the listed rows: dx += dLoss/dx; dWeight and dBias accumulate.
  function layerNormBackward(dy, xhat, rstd, weight, dWeight, dBias, dx, numRows, d, rows) {
    const n = rows === null ? numRows : rows.length;
    for (let a = 0; a < n; a++) {
      const r = rows === null ? a : rows[a];
      const o = r * d;
      let meanG = 0, meanGx = 0;
      for (let i = 0; i < d; i++) {
        const g = dy[o + i] * weight[i];
        meanG += g;
        meanGx += g * xhat[o + i];
        dWeight[i] += dy[o + i] * xhat[o + i];
        dBias[i] += dy[o + i];
      }
      meanG /= d;
      meanGx /= d;
      const inv = rstd[r];
      for (let i = 0; i < d; i++) {
        dx[o + i] += inv * (dy[o + i] * weight[i] - meanG - xhat[o + i] * meanGx);
      }
    }
  }

  // The rows whose flag is set, as a list of row indices.
  function listRows(flags) {
    const rows = [];
    for (let r = 0; r < flags.length; r++) { if (flags[r]) { rows.push(r); } }
    return Int32Array.from(rows);
  }

  function createModel(config) {
    const {vocabSize: V, dModel: d, numHeads: H, numLayers: L, contextLength: maxT} = config;
    const hd = d / H, half = hd / 2;
    const scale = 1 / Math.sqrt(hd);
    // RoPE (positions.rotary_embedding, split-half pairs): pair i of position t turns by the
    // angle t * base^(-2i / head_dim), computed in float64.
    const base = config.ropeBase || 10000;
    const cos = new Float64Array(maxT * half), sin = new Float64Array(maxT * half);
    for (let t = 0; t < maxT; t++) {
      for (let i = 0; i < half; i++) {
        const angle = t * Math.pow(base, (-2.0 * i) / hd);
        cos[t * half + i] = Math.cos(angle);
        sin[t * half + i] = Math.sin(angle);
      }
    }
    // Turn the listed rows of x (B * T, d_model), every head, in place; `inverse` turns back,
    // which is also how a rotation's gradient flows.
    function rotate(x, numRows, seqLen, rows, inverse) {
      const sign = inverse ? -1 : 1;
      const n = rows === null ? numRows : rows.length;
      for (let a = 0; a < n; a++) {
        const r = rows === null ? a : rows[a];
        const t = r % seqLen;
        for (let h = 0; h < H; h++) {
          const o = r * d + h * hd;
          for (let i = 0; i < half; i++) {
            const c = cos[t * half + i], s = sign * sin[t * half + i];
            const first = x[o + i], second = x[o + i + half];
            x[o + i] = first * c - second * s;
            x[o + i + half] = first * s + second * c;
          }
        }
      }
    }

    // The softmax of the first `count` scores (times scale) of a row, written to weights: the
    // largest score is subtracted first, as attention_book.softmax does.
    function causalSoftmax(scores, weights, offset, count) {
      let top = -Infinity;
      for (let s = offset; s < offset + count; s++) {
        const score = scores[s] * scale;
        scores[s] = score;
        if (score > top) { top = score; }
      }
      let total = 0;
      for (let s = offset; s < offset + count; s++) {
        const e = Math.exp(scores[s] - top);
        scores[s] = e;
        total += e;
      }
      for (let s = offset; s < offset + count; s++) { weights[s] = scores[s] / total; }
    }

    // Head h of sequence b of x (B * T, d_model), as its own matrix (T, head_dim); with
    // `transposed`, (head_dim, T). `name` picks the scratch array it is written to.
    function headSlice(name, x, b, h, seqLen, transposed) {
      const out = scratch(name, seqLen * hd);
      for (let t = 0; t < seqLen; t++) {
        const o = (b * seqLen + t) * d + h * hd;
        for (let j = 0; j < hd; j++) {
          out[transposed ? j * seqLen + t : t * hd + j] = x[o + j];
        }
      }
      return out;
    }

    function transpose(name, x, rows, cols) {  // (rows, cols) -> (cols, rows)
      const out = scratch(name, rows * cols);
      for (let r = 0; r < rows; r++) {
        for (let c = 0; c < cols; c++) { out[c * rows + r] = x[r * cols + c]; }
      }
      return out;
    }

    // For each sequence, the positions (0 ... T - 1) that `rows` lists; null: all of them.
    function rowsBySequence(rows, numSeqs, seqLen) {
      if (rows === null) { return null; }
      const lists = Array.from({length: numSeqs}, () => []);
      for (const r of rows) { lists[Math.floor(r / seqLen)].push(r % seqLen); }
      return lists.map(list => Int32Array.from(list));
    }

    // Causal attention of every head for the listed query rows (null: all): the weights
    // w (B, H, T, T) and the context vectors ctx (B * T, d_model), the heads side by side.
    // Each head of each sequence is a small matrix product: scores = Q K^T * scale, the
    // softmax over the keys 0 ... t of each query t, then ctx = weights V.
    function attend(q, k, v, ctx, w, numSeqs, seqLen, rows) {
      const bySequence = rowsBySequence(rows, numSeqs, seqLen);
      const scores = new Float64Array(seqLen * seqLen), out = new Float64Array(seqLen * hd);
      for (let b = 0; b < numSeqs; b++) {
        const queries = bySequence === null ? null : bySequence[b];
        if (queries !== null && queries.length === 0) { continue; }
        const count = queries === null ? seqLen : queries.length;
        for (let h = 0; h < H; h++) {
          const Q = headSlice("Q", q, b, h, seqLen, false), K = headSlice("K", k, b, h, seqLen, false);
          matmulNT(Q, queries, seqLen, K, seqLen, hd, scores, false, 1);  // (T, T)
          const W = w.subarray((b * H + h) * seqLen * seqLen, (b * H + h + 1) * seqLen * seqLen);
          for (let a = 0; a < count; a++) {
            const t = queries === null ? a : queries[a];
            causalSoftmax(scores, W, t * seqLen, t + 1);
          }
          matmulNT(W, queries, seqLen, headSlice("VT", v, b, h, seqLen, true), hd, seqLen, out, false,
                   2);  // (T, head_dim)
          for (let a = 0; a < count; a++) {
            const t = queries === null ? a : queries[a];
            const o = (b * seqLen + t) * d + h * hd;
            for (let j = 0; j < hd; j++) { ctx[o + j] = out[t * hd + j]; }
          }
        }
      }
    }

    // The backward pass of attend, from dctx: dq (of the listed rows), dk and dv accumulate.
    function attendBackward(q, k, v, w, dctx, dq, dk, dv, numSeqs, seqLen, rows) {
      const bySequence = rowsBySequence(rows, numSeqs, seqLen);
      const dW = new Float64Array(seqLen * seqLen), dS = new Float64Array(seqLen * seqLen);
      const dQ = new Float64Array(seqLen * hd), dK = new Float64Array(seqLen * hd);
      const dV = new Float64Array(seqLen * hd);
      for (let b = 0; b < numSeqs; b++) {
        const queries = bySequence === null ? null : bySequence[b];
        if (queries !== null && queries.length === 0) { continue; }
        const count = queries === null ? seqLen : queries.length;
        for (let h = 0; h < H; h++) {
          const W = w.subarray((b * H + h) * seqLen * seqLen, (b * H + h + 1) * seqLen * seqLen);
          const dC = headSlice("dC", dctx, b, h, seqLen, false);
          // ctx = W V: dW = dctx V^T (keys s <= t), dV = W^T dctx
          matmulNT(dC, queries, seqLen, headSlice("V", v, b, h, seqLen, false), seqLen, hd, dW, false, 1);
          matmulNT(transpose("WT", W, seqLen, seqLen), null, seqLen, headSlice("dCT", dctx, b, h, seqLen, true),
                   hd, seqLen, dV, false, 3);
          // the softmax's backward, then the scale's: dS = W * (dW - rowsum(W * dW)) * scale
          dS.fill(0);
          for (let a = 0; a < count; a++) {
            const t = queries === null ? a : queries[a], o = t * seqLen;
            let weighted = 0;
            for (let s = 0; s <= t; s++) { weighted += W[o + s] * dW[o + s]; }
            for (let s = 0; s <= t; s++) { dS[o + s] = W[o + s] * (dW[o + s] - weighted) * scale; }
          }
          // scores = Q K^T: dQ = dS K, dK = dS^T Q
          matmulNT(dS, queries, seqLen, headSlice("KT", k, b, h, seqLen, true), hd, seqLen, dQ, false, 2);
          matmulNT(transpose("dST", dS, seqLen, seqLen), null, seqLen, headSlice("QT", q, b, h, seqLen, true),
                   hd, seqLen, dK, false, 3);
          for (let t = 0; t < seqLen; t++) {
            const o = (b * seqLen + t) * d + h * hd;
            for (let j = 0; j < hd; j++) {
              dk[o + j] += dK[t * hd + j];
              dv[o + j] += dV[t * hd + j];
            }
          }
          for (let a = 0; a < count; a++) {
            const t = queries === null ? a : queries[a];
            const o = (b * seqLen + t) * d + h * hd;
            for (let j = 0; j < hd; j++) { dq[o + j] += dQ[t * hd + j]; }
          }
        }
      }
    }

    // The forward pass (TinyGPT.forward) of numSeqs sequences of seqLen tokens. `lastRows`
    // lists the positions whose logits are needed (null: all): the last layer computes its
    // queries, and the output layer its logits, only there, since nothing else reads them.
    // Returns what backward needs, the logits (zero elsewhere) among it.
    function forward(P, tokens, numSeqs, seqLen, lastRows) {
      const N = numSeqs * seqLen;
      const cache = {numSeqs, seqLen, tokens, layers: [], lastRows};
      let x = scratch("x0", N * d);  // (B * T, d_model): the residual stream
      const E = P["token_embedding.weight"], Pos = P["position_embedding.weight"];
      for (let r = 0; r < N; r++) {
        const token = tokens[r], t = r % seqLen;
        for (let i = 0; i < d; i++) {
          x[r * d + i] = E[token * d + i] + (config.rope ? 0 : Pos[t * d + i]);
        }
      }
      for (let l = 0; l < L; l++) {
        const p = `blocks.${l}.`;
        const rows = l === L - 1 ? lastRows : null;  // the query rows this layer computes
        const c = {h: scratch(`h${l}`, N * d), xhat: scratch(`xhat${l}`, N * d),
                   rstd: scratch(`rstd${l}`, N), q: scratch(`q${l}`, N * d),
                   k: scratch(`k${l}`, N * d), v: scratch(`v${l}`, N * d),
                   ctx: scratch(`ctx${l}`, N * d), w: scratch(`w${l}`, numSeqs * H * seqLen * seqLen),
                   rows};
        // x + attention(LayerNorm(x)): the keys and values of every row, the queries of `rows`
        layerNorm(x, P[`${p}attention_norm.weight`], P[`${p}attention_norm.bias`], c.h, c.xhat,
                  c.rstd, N, d, null);
        linear(c.h, P[`${p}attention.W_query.weight`], null, c.q, N, d, d, rows);
        linear(c.h, P[`${p}attention.W_key.weight`], null, c.k, N, d, d, null);
        linear(c.h, P[`${p}attention.W_value.weight`], null, c.v, N, d, d, null);
        if (config.rope) {
          rotate(c.q, N, seqLen, rows, false);
          rotate(c.k, N, seqLen, null, false);
        }
        attend(c.q, c.k, c.v, c.ctx, c.w, numSeqs, seqLen, rows);
        const next = scratch(`x${l + 1}`, N * d);
        next.set(x);
        const out = scratch("out", N * d);
        linear(c.ctx, P[`${p}attention.out_proj.weight`], P[`${p}attention.out_proj.bias`], out,
               N, d, d, rows);
        for (let i = 0; i < N * d; i++) { next[i] += out[i]; }
        cache.layers.push(c);
        x = next;
      }
      cache.hf = scratch("hf", N * d);
      cache.xhatF = scratch("xhatF", N * d);
      cache.rstdF = scratch("rstdF", N);
      layerNorm(x, P["final_norm.weight"], P["final_norm.bias"], cache.hf, cache.xhatF,
                cache.rstdF, N, d, lastRows);
      const logits = scratch("logits", N * V);  // (B * T, vocab_size)
      linear(cache.hf, P["output.weight"], null, logits, N, d, V, lastRows);
      cache.logits = logits;
      return cache;
    }

    // repeat_loss: the mean cross-entropy of the next token at the rows that `lossRows` lists
    // (never the last position of a sequence), and the accuracy of the most likely token there
    // (the first of equal ones, as argmax). With `grad`, dLoss/dlogits is written there.
    function repeatLoss(cache, lossRows, grad) {
      const {tokens, logits} = cache;
      const count = lossRows.length;
      let total = 0, right = 0;
      for (let a = 0; a < count; a++) {
        const r = lossRows[a];
        const o = r * V, target = tokens[r + 1];
        let top = -Infinity, best = 0;
        for (let u = 0; u < V; u++) { if (logits[o + u] > top) { top = logits[o + u]; best = u; } }
        let sum = 0;
        for (let u = 0; u < V; u++) { sum += Math.exp(logits[o + u] - top); }
        const logSum = Math.log(sum);
        total -= logits[o + target] - top - logSum;
        if (best === target) { right++; }
        if (grad) {
          for (let u = 0; u < V; u++) {
            grad[o + u] = (Math.exp(logits[o + u] - top - logSum) - (u === target ? 1 : 0)) / count;
          }
        }
      }
      return {loss: total / count, accuracy: right / count};
    }

    // The backward pass of forward(), from dLoss/dlogits: the gradient of every parameter.
    function backward(P, cache, dLogits) {
      const {numSeqs, seqLen, tokens, lastRows} = cache;
      const N = numSeqs * seqLen;
      const G = zeros(config);
      const dhf = scratch("dhf", N * d);
      linearBackward(cache.hf, P["output.weight"], dLogits, G["output.weight"], null, dhf, N, d,
                     V, lastRows);
      const dx = scratch("dx", N * d);  // dLoss / d(residual stream), from the top down
      layerNormBackward(dhf, cache.xhatF, cache.rstdF, P["final_norm.weight"],
                        G["final_norm.weight"], G["final_norm.bias"], dx, N, d, lastRows);
      for (let l = L - 1; l >= 0; l--) {
        const p = `blocks.${l}.`;
        const c = cache.layers[l];
        const rows = c.rows;
        // x_out = x_in + out_proj(ctx): dx passes on to x_in unchanged, and flows into ctx
        const dctx = scratch("dctx", N * d);
        linearBackward(c.ctx, P[`${p}attention.out_proj.weight`], dx,
                       G[`${p}attention.out_proj.weight`], G[`${p}attention.out_proj.bias`], dctx,
                       N, d, d, rows);
        const dq = scratch("dq", N * d), dk = scratch("dk", N * d), dv = scratch("dv", N * d);
        attendBackward(c.q, c.k, c.v, c.w, dctx, dq, dk, dv, numSeqs, seqLen, rows);
        if (config.rope) {
          rotate(dq, N, seqLen, rows, true);
          rotate(dk, N, seqLen, null, true);
        }
        const dh = scratch("dh", N * d);
        linearBackward(c.h, P[`${p}attention.W_query.weight`], dq,
                       G[`${p}attention.W_query.weight`], null, dh, N, d, d, rows);
        linearBackward(c.h, P[`${p}attention.W_key.weight`], dk, G[`${p}attention.W_key.weight`],
                       null, dh, N, d, d, null);
        linearBackward(c.h, P[`${p}attention.W_value.weight`], dv,
                       G[`${p}attention.W_value.weight`], null, dh, N, d, d, null);
        layerNormBackward(dh, c.xhat, c.rstd, P[`${p}attention_norm.weight`],
                          G[`${p}attention_norm.weight`], G[`${p}attention_norm.bias`], dx, N, d,
                          null);
      }
      const dE = G["token_embedding.weight"], dPos = G["position_embedding.weight"];
      for (let r = 0; r < N; r++) {
        const token = tokens[r], t = r % seqLen;
        for (let i = 0; i < d; i++) {
          dE[token * d + i] += dx[r * d + i];
          if (!config.rope) { dPos[t * d + i] += dx[r * d + i]; }
        }
      }
      return G;
    }

    return {forward, repeatLoss, backward};
  }

  // ---------------------------------------------------------------------------------------
  // The head scores of attention_book.heads, from the weights of forward() on the probe.

  // induction_targets: key s is a target of query t when s <= t and tokens[s - 1] == tokens[t].
  function inductionTargets(tokens, numSeqs, seqLen) {
    const targets = new Uint8Array(numSeqs * seqLen * seqLen);  // (B, T, T)
    for (let b = 0; b < numSeqs; b++) {
      for (let t = 0; t < seqLen; t++) {
        for (let s = 1; s <= t; s++) {
          if (tokens[b * seqLen + s - 1] === tokens[b * seqLen + t]) {
            targets[(b * seqLen + t) * seqLen + s] = 1;
          }
        }
      }
    }
    return targets;
  }

  // induction_scores_of_weights and previous_token_scores_of_weights(keys = target_keys):
  // one (num_layers, num_heads) table each, as nested arrays.
  function headScores(cache, targets, config) {
    const {numSeqs, seqLen} = cache;
    const H = config.numHeads;
    const hasTarget = new Uint8Array(numSeqs * seqLen), isKey = new Uint8Array(numSeqs * seqLen);
    let queries = 0, keys = 0;
    for (let b = 0; b < numSeqs; b++) {
      for (let t = 0; t < seqLen; t++) {
        for (let s = 0; s < seqLen; s++) {
          if (targets[(b * seqLen + t) * seqLen + s]) {
            hasTarget[b * seqLen + t] = 1;
            isKey[b * seqLen + s] = 1;
          }
        }
      }
    }
    for (let r = 0; r < numSeqs * seqLen; r++) {
      queries += hasTarget[r];
      if (r % seqLen > 0) { keys += isKey[r]; }
    }
    const induction = [], previous = [];
    cache.layers.forEach(c => {
      const inductionRow = [], previousRow = [];
      for (let h = 0; h < H; h++) {
        let onTargets = 0, onPrevious = 0;
        for (let b = 0; b < numSeqs; b++) {
          const wBase = (b * H + h) * seqLen * seqLen;
          for (let t = 0; t < seqLen; t++) {
            const r = b * seqLen + t;
            if (hasTarget[r]) {
              let sum = 0;
              for (let s = 0; s <= t; s++) {
                if (targets[r * seqLen + s]) { sum += c.w[wBase + t * seqLen + s]; }
              }
              onTargets += sum;
            }
            if (t > 0 && isKey[r]) { onPrevious += c.w[wBase + t * seqLen + t - 1]; }
          }
        }
        inductionRow.push(queries ? onTargets / queries : NaN);
        previousRow.push(keys ? onPrevious / keys : NaN);
      }
      induction.push(inductionRow);
      previous.push(previousRow);
    });
    return {induction, previousToken: previous};
  }

  // ---------------------------------------------------------------------------------------
  // train_on_repeats, one step at a time.
  function createTrainer(config, options) {
    const {seed, lr, steps, offset} = options;
    const model = createModel(config);
    const P = options.parameters || initialParameters(config, seed);
    const M = zeros(config), Vs = zeros(config);  // AdamW's exp_avg and exp_avg_sq
    const generator = new TorchGenerator(seed);
    const {batchSize, contextLength: T, segmentLen, vocabSize} = config;
    const probe = options.probe || repeatedSegments(new TorchGenerator(config.probeSeed),
                                                    config.probeSize, T, segmentLen, vocabSize, null);
    const probeTargets = inductionTargets(probe.tokens, probe.batchSize, T);
    const probeRows = listRows(probe.lossMask);
    const beta1 = 0.9, beta2 = 0.999, eps = 1e-8, weightDecay = config.weightDecay;
    let step = 0;

    function trainStep() {
      if (step >= steps) { return null; }
      const batch = repeatedSegments(generator, batchSize, T, segmentLen, vocabSize, offset);
      const lossRows = listRows(batch.lossMask);
      const cache = model.forward(P, batch.tokens, batchSize, T, lossRows);
      const dLogits = new Float64Array(batchSize * T * vocabSize);
      const {loss} = model.repeatLoss(cache, lossRows, dLogits);
      const G = model.backward(P, cache, dLogits);
      // LambdaLR: the learning rate of step k (from 0) is lr * (1 - k / steps).
      const rate = lr * (1 - step / steps);
      const t = step + 1;  // AdamW's step count
      const bias1 = 1 - beta1 ** t, bias2 = 1 - beta2 ** t;
      const stepSize = rate / bias1, bias2Sqrt = bias2 ** 0.5;
      const decay = 1 - rate * weightDecay;
      const w1 = 1 - beta1, w2 = 1 - beta2;
      for (const name in P) {
        const p = P[name], g = G[name], m = M[name], v = Vs[name];
        for (let i = 0; i < p.length; i++) {
          p[i] *= decay;  // the decoupled weight decay
          m[i] += w1 * (g[i] - m[i]);  // exp_avg.lerp_(grad, 1 - beta1)
          v[i] = v[i] * beta2 + w2 * g[i] * g[i];
          p[i] += -stepSize * (m[i] / (Math.sqrt(v[i]) / bias2Sqrt + eps));
        }
      }
      step = t;
      return {step, loss};
    }

    function record() {
      const cache = model.forward(P, probe.tokens, probe.batchSize, T, null);
      const {loss, accuracy} = model.repeatLoss(cache, probeRows, null);
      const scores = headScores(cache, probeTargets, config);
      return {step, loss, accuracy, induction: scores.induction,
              previousToken: scores.previousToken};
    }

    // Every layer's weights on one sequence (a list of token ids): [layer][head] -> T x T rows.
    function attention(tokens) {
      const n = tokens.length;
      const cache = model.forward(P, Int32Array.from(tokens), 1, n, null);
      return cache.layers.map(c => {
        const heads = [];
        for (let h = 0; h < config.numHeads; h++) {
          const rows = [];
          for (let t = 0; t < n; t++) {
            rows.push(Array.from(c.w.subarray((h * n + t) * n, (h * n + t) * n + n)));
          }
          heads.push(rows);
        }
        return heads;
      });
    }

    return {trainStep, record, attention, parameters: P, probe,
            get step() { return step; }, steps};
  }

  return {TorchGenerator, repeatedSegments, parameterShapes, initialParameters, createModel,
          inductionTargets, headScores, createTrainer};
}
