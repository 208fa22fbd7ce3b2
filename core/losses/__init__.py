"""Loss modules, one per file (lightly-style); this file only re-exports them."""
from core.losses.contrastive import InfoNCELoss, info_nce
from core.losses.triplet import TripletLoss
from core.losses.vicreg import VICRegLoss, covariance_loss, invariance_loss, variance_loss
from core.losses.nested import NestedContrastiveLoss, inner_losses, nested_total, outer_loss, symmetric_infonce
from core.losses.make import CLIPLoss, MAKELoss, clip_infonce, diagnosis_weights, knowledge_enhanced_visual, multi_aspect_contrastive, slra
from core.losses.conceptclip import ConceptCLIPLoss, SigLIPLoss, rc_align, region_concept_score, sigmoid_it_align
from core.losses.unimodal import CLIPUnimodalLoss, nt_xent
