"""Export a trained run as a model folder another centre can use, without its patient data.

``python -m core.export_model RUN OUT`` writes ``OUT/model.safetensors`` + ``OUT/config.json``
(+ a model card ``README.md``), Hugging Face's ``save_pretrained`` layout:

- a TriDerm-V run (``vision-triderm``): the head and embedding centre; the config names the
  backbone, layer and normalisation, the training recipe, the run's metrics and a data summary
  of counts. Load it with ``python -m core.embed --model OUT`` (or ``--model hf-hub:<org>/<repo>``
  once uploaded, e.g. ``hf upload <org>/<repo> OUT``).
- a fine-tune run (``vision-finetune``): the tuned last stage + head and the study's centre; the config
  names the backbone (whose frozen stages it runs on), the fine-tuning recipe, the run's metrics and
  the data summary. Loaded the same way.
- a frozen run (``vision-baseline``, what ``python -m core.train_triderm --mode auto`` records for a workspace
  without triplets): the backbone name (with its layer), normalisation and the study's centre. Loaded the same way.
- a segmenter run (``segmenter``): the FPN decoder and the encoder identity it was trained over
  (:mod:`core.segmentation.export`).

Every folder's ``README.md`` is its model card (:func:`core.vision.model_card.model_card`): licence, base model,
training data counts, the run's held-out figures as its record holds them, intended use and limits, how to load it.

No photo, patient or wound id and no description is written. A ``text-soe`` run cannot be
exported: it is one coordinate per study photo, keyed by the photo's id, and holds no model that
could place another centre's photos.

    python -m core.export_model 3 shared/lite0-head [--workspace W]
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

from annotations.store import runs
from core import cli
from core.runtime import open_workspace, user_errors


def main(argv: list[str] | None = None) -> int:
    """The ``python -m core.export_model`` job; returns the exit status."""
    parser = argparse.ArgumentParser(prog="python -m core.export_model", description=__doc__.splitlines()[0])
    cli.add_workspace(parser)
    parser.add_argument("run", type=int, metavar="RUN",
                        help="run id (a vision-triderm, vision-finetune, frozen vision-baseline or segmenter run)")
    parser.add_argument("out", type=Path, metavar="OUT", help="new (or empty) folder to write the model to")
    args = cli.parse_args(parser, argv)
    from core.segmentation.export import export_segmenter  # torch: after the arguments (a fast --help)
    from core.vision.inference import FROZEN_RUN, export_frozen, export_head, export_tail

    ws = open_workspace(args.workspace, parser)
    with user_errors(parser, ValueError):
        run = runs.finished(ws, args.run)
        if run["kind"] == runs.VISION_TRIDERM:
            out = export_head(ws, args.run, args.out)
        elif run["kind"] == runs.VISION_FINETUNE:
            out = export_tail(ws, args.run, args.out)
        elif run["kind"] == FROZEN_RUN:
            out = export_frozen(ws, args.run, args.out)
        elif run["kind"] == runs.SEGMENTER:
            out = export_segmenter(ws, args.run, args.out)
        elif run["kind"] == runs.TEXT_SOE:
            raise ValueError(f"run {args.run} is a text-soe run: one coordinate per study photo, keyed by its id; "
                             "it holds no model that could place another centre's photos, so it is not exported")
        else:
            raise ValueError(f"run {args.run} is a {run['kind']} run; export takes a vision-triderm, vision-finetune, "
                             "frozen vision-baseline or segmenter run")
    print(json.dumps({"run": args.run, "kind": run["kind"], "out": str(out),
                      "files": sorted(p.name for p in out.iterdir())}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
