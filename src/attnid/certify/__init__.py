"""The ``certify`` method of :func:`attnid.audit.audit`: the exact rank of our layer's Jacobian without
forming it, in five steps (each a function below).

1. :func:`output_block`: the output is linear in ``(W_O, b_O)`` with the same block ``Z`` for every output
   coordinate, so that block's rank is ``E·rank(Z)`` and its range is projected out exactly.
2. :func:`certification_blocks`: the known null directions (:func:`attnid.symmetry.tangent_rows`, or
   those supplied; held as sparse rows, :func:`direction_rows`), and the parts of the remaining parameters φ
   certified on their own (one per key/value group where ``W_O`` is injective, else the whole φ). A group's
   mixtures are differentiated once with respect to its activations ``Q, K, V`` (:class:`GroupActivations`);
   its value part splits off channel by channel where the value directions allow (:func:`_split_known`), and
   the rest is certified on the orthogonal complement of its known directions (a Householder QR in compact WY
   form). The whole φ is certified on the coordinates left free when the known directions pin ``k_b`` of them
   by LU pivoting (its sketch reads coordinates).
3. :func:`null_residuals` and :func:`largest_singular_value`: ``‖J t‖ / ‖t‖`` of every known direction
   (forward mode; through its own group's activations where the groups split, :func:`null_residuals_by_group`)
   and ``‖J‖₂`` (block power iteration), which sets the tolerance's scale.
4. :func:`per_group_certificate` (``W_O`` injective): each group's exact projected Jacobian on the
   complement as a block-triangular factor, its value channels' blocks from a small QR and its query/key block
   from a Cholesky of its Gram (formed from the activations; its rounding bound widens the result, and a QR
   decides where the bound is not small), its extreme singular values by block inverse and power iteration
   (:func:`group_singular_values`); or :func:`whole_sketch_certificate`: one Gaussian sketch of side
   ``n_free`` and its condition number.
5. :func:`certify`: the known directions must be null and the rest of full rank, or
   :class:`CertificateError`; then ``rank = E·rank(Z) + n_free``.

The steps live in :mod:`.blocks` (1, 2), :mod:`.activations` (2), :mod:`.certificate` (3, 5) and
:mod:`.strategies` (4), on the linear algebra of :mod:`.linalg`.
"""

from .activations import ACTIVATION_RTOL, GroupActivations
from .blocks import (
    VALUE_PARAMS,
    Directions,
    OutputBlock,
    certification_blocks,
    direction_rows,
    output_block,
    splits_by_group,
)
from .certificate import (
    RESIDUAL_ENTRIES,
    Certified,
    certify,
    largest_singular_value,
    null_residuals,
    null_residuals_by_group,
)
from .linalg import (
    GRAM_MARGIN,
    INVERSE_ITER,
    POWER_BLOCK,
    POWER_MAX_ITER,
    POWER_RTOL,
    CertificateError,
    StageTimer,
    smallest_singular_value,
    top_singular_value,
)
from .strategies import Certificate, group_singular_values, per_group_certificate, whole_sketch_certificate

__all__ = [
    "ACTIVATION_RTOL",
    "GRAM_MARGIN",
    "INVERSE_ITER",
    "POWER_BLOCK",
    "POWER_MAX_ITER",
    "POWER_RTOL",
    "RESIDUAL_ENTRIES",
    "VALUE_PARAMS",
    "Certificate",
    "CertificateError",
    "Certified",
    "Directions",
    "GroupActivations",
    "OutputBlock",
    "StageTimer",
    "certification_blocks",
    "certify",
    "direction_rows",
    "group_singular_values",
    "largest_singular_value",
    "null_residuals",
    "null_residuals_by_group",
    "output_block",
    "per_group_certificate",
    "smallest_singular_value",
    "splits_by_group",
    "top_singular_value",
    "whole_sketch_certificate",
]
