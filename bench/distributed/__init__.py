"""Several ranks: hpac-train --compare and torchrun runs of hpac.harness.dist_train."""
