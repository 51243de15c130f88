"""The diagnosis context: what every check receives.

A :class:`DiagnosisContext` holds the subject, its device, dtype and
tolerances, builds probe tensors in the right place, and caches the
measurements several checks share (the standard call, the reference, the
fitted hypotheses, the influence of each token on each output).
"""

from __future__ import annotations

import math

import torch

from .numerics import Tolerances, precise_dtype, row_change, tolerances_for
from .outcomes import NotApplicable
from .reference import ModuleReference, fit, function_hypotheses
from .subjects import FunctionSubject, ModuleSubject, cpu_generator, draw


class DiagnosisContext:
    """The subject under diagnosis, its probes and the measurements the checks share.

    Attributes:
        subject: a ``FunctionSubject`` or ``ModuleSubject``.
        is_module: whether the subject is a module ``x -> output``.
        device: where every probe is built (the subject's device).
        dtype: the floating dtype of every probe (the subject's dtype).
        precise: the dtype of references and measurements (float64 where the device has it).
        tol: the :class:`~attention_book.diagnose.numerics.Tolerances` of ``dtype``.
        cache: measurements shared between checks, by name.
    """

    def __init__(self, subject: FunctionSubject | ModuleSubject):
        self.subject = subject
        self.is_module = subject.kind == "module"
        self.device: torch.device = subject.device
        self.dtype: torch.dtype = subject.dtype
        self.precise: torch.dtype = precise_dtype(subject.device)
        self.tol: Tolerances = tolerances_for(subject.dtype)
        self.cache: dict[str, object] = {}

    # Probe tensors, always on the subject's device ---------------------------

    def randn(self, shape, generator: torch.Generator) -> torch.Tensor:
        """Standard normal noise of ``shape`` in the subject's device and dtype."""
        return draw(shape, generator, self.device, self.dtype)

    def random_mask(self, shape, seed: int, keep: float) -> torch.Tensor:
        """A boolean mask of ``shape``, True with probability ``keep``, drawn with ``seed``."""
        uniform = torch.rand(shape, generator=cpu_generator(seed), device="cpu", dtype=torch.float32)
        return (uniform < keep).to(self.device)

    def full_mask(self, shape, value: bool) -> torch.Tensor:
        """A boolean mask of ``shape`` filled with ``value``."""
        return torch.full(shape, value, dtype=torch.bool, device=self.device)

    def eye(self, n: int) -> torch.Tensor:
        """The ``(n, n)`` boolean identity."""
        return torch.eye(n, dtype=torch.bool, device=self.device)

    def scales(self, *values: float) -> torch.Tensor:
        """Scales ``(S,)`` for a reference, in the precise dtype."""
        return torch.tensor(values, dtype=self.precise, device=self.device)

    # Shared measurements -----------------------------------------------------

    def standard(self):
        """The standard call: inputs, output and weights (cached)."""
        if "standard" not in self.cache:
            s = self.subject
            if self.is_module:
                x = s.inputs()
                out, weights = s.call(x)
                self.cache["standard"] = (x, out, weights)
            else:
                q, k, v = s.inputs()
                out, weights = s.call(q, k, v)
                self.cache["standard"] = ((q, k, v), out, weights)
        return self.cache["standard"]

    def reference(self) -> ModuleReference:
        """The module recomputed from its weights (cached); NotApplicable when it cannot be."""
        if "reference" not in self.cache:
            try:
                self.cache["reference"] = ModuleReference(self.subject.module, self.subject.causal)
            except NotApplicable as error:
                self.cache["reference"] = error
        ref = self.cache["reference"]
        if isinstance(ref, NotApplicable):
            raise ref
        return ref

    def fits(self):
        """The hypotheses (softmax dim, head split) that reproduce the output, with scales."""
        if "fits" not in self.cache:
            inputs, out, _ = self.standard()
            if self.is_module:
                hypotheses = self.reference().hypotheses(inputs)
            else:
                hypotheses = function_hypotheses(*inputs)
            self.cache["fits"] = fit(hypotheses, out, self.tol.fit)
        return self.cache["fits"]

    def expected_scale(self) -> tuple[float, int]:
        """``(1/sqrt(head_dim), head_dim)``."""
        if self.is_module:
            head_dim = self.reference().head_dim
        else:
            head_dim = self.subject.head_dim
        return 1.0 / math.sqrt(head_dim), head_dim

    def influence(self, mask=None, num_tokens=None, seed=1, values_only=False) -> torch.Tensor:
        """``I[i, j]``: how much output row i moves when token j changes ``(T, T)``.

        For a function, token j is key j and value j (only value j with
        ``values_only``, which measures the weight itself); for a module it is
        input row j.
        """
        s = self.subject
        if self.is_module:
            x = s.inputs(batch_size=1, num_tokens=num_tokens, seed=seed)  # (1, T, d_in)
            base, _ = s.call(x, mask)
            num = x.shape[1]
            gen = cpu_generator(seed + 100)
            rows = []
            for j in range(num):
                x2 = x.clone()
                x2[:, j] += 2.0 * self.randn(x.shape[-1], gen)
                out, _ = s.call(x2, mask)
                rows.append(row_change(out, base))
            return torch.stack(rows, dim=1)  # (T, T): column j = effect of token j
        q, k, v = s.inputs(batch_size=1, num_queries=num_tokens, seed=seed)
        base, _ = s.call(q, k, v, mask)
        num = k.shape[1]
        gen = cpu_generator(seed + 100)
        cols = []
        for j in range(num):
            k2, v2 = k.clone(), v.clone()
            k_shift = 2.0 * self.randn(k.shape[-1], gen)
            if not values_only:
                k2[:, j] += k_shift
            v2[:, j] += 2.0 * self.randn(v.shape[-1], gen)
            out, _ = s.call(q, k2, v2, mask)
            cols.append(row_change(out, base))
        return torch.stack(cols, dim=1)  # (T_q, T_k)
