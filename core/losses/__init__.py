"""Loss modules, one per file (lightly-style); this file only re-exports them."""
from core.losses.contrastive import InfoNCELoss, info_nce
from core.losses.triplet import TripletLoss
from core.losses.vicreg import VICRegLoss, covariance_loss, invariance_loss, variance_loss
from core.losses.nested import NestedContrastiveLoss, inner_losses, nested_total, outer_loss, symmetric_infonce
