"""Loss modules, one small ``nn.Module`` per file (lightly-style), each citing its paper; this file
only re-exports them.

TriDerm-V (METHODS.md §1): :mod:`.vicreg` (default), :mod:`.contrastive` (InfoNCE) and
:mod:`.triplet` for the loss ablation, :mod:`.expert_triplet` for learning from the expert's
triplets; SLIMP (§2): :mod:`.nested`; MAKE (§3): :mod:`.make`;
ConceptCLIP (§4): :mod:`.conceptclip` (with SigLIP); contrastive benchmark (§5): :mod:`.unimodal`.
"""
from core.losses.conceptclip import ConceptCLIPLoss, SigLIPLoss, rc_align, region_concept_score, sigmoid_it_align
from core.losses.contrastive import InfoNCELoss, info_nce
from core.losses.expert_triplet import ExpertTripletLoss
from core.losses.make import (
    CLIPLoss,
    MAKELoss,
    clip_infonce,
    diagnosis_weights,
    knowledge_enhanced_visual,
    multi_aspect_contrastive,
    slra,
)
from core.losses.nested import NestedContrastiveLoss, inner_losses, nested_total, outer_loss, symmetric_infonce
from core.losses.triplet import TripletLoss
from core.losses.unimodal import CLIPUnimodalLoss, SimCLRProjector, nt_xent
from core.losses.vicreg import VICRegLoss, covariance_loss, invariance_loss, variance_loss
