// Outline editor: a Streamlit components.v2 module (vanilla JS + SVG, no build step).
//
// Data from Python (see __init__.py): image (URI), width/height (photo px), version, shapes
// [{key, kind: "wound"|"candidate", index, id, label, colour, polys: [[[x, y], ...], ...]}],
// overlap (polygons to hatch), clicks ([{x, y, include}]), stage_height (px of the stage).
// Coordinates are continuous photo coordinates (pixel (c, r) spans [c, c+1) x [r, r+1)).
//
// The editor keeps the clinician's unsaved edits in the browser until `version` changes (a save):
// zoom (wheel, +/-, Fit the photo, W the wounds' box), pan (drag the background, or the middle button / Space+drag in any mode),
// vertex drag, add a vertex (double-click an edge), delete one (Alt+click or right-click it, or
// the Delete key), draw a new outline (click points; click the first point or press Enter to close),
// undo/redo (buttons, Ctrl+Z / Ctrl+Y), and "click to outline". Actions reach Python as one trigger,
// `action`: {type: save|accept|reject|click, ...}; Python validates and writes.

const SVGNS = "http://www.w3.org/2000/svg";
const HANDLE_PX = 6;      // vertex handle radius on screen
const CLOSE_PX = 10;      // a click this near the first point closes a drawing
const DOUBLE_MS = 450;    // two presses this close in time (and 6 px in space) are a double-click
const EDGE_PX = 12;       // a double-click this near an edge of the selected outline adds a vertex there
const MAX_ZOOM = 40;

function el(tag, attrs = {}, parent = null) {
  const node = document.createElementNS(SVGNS, tag);
  for (const [k, v] of Object.entries(attrs)) node.setAttribute(k, v);
  if (parent) parent.appendChild(node);
  return node;
}

function button(label, title, parent, onClick, cls = "") {
  const b = document.createElement("button");
  b.type = "button";
  b.textContent = label;
  b.title = title;
  if (cls) b.className = cls;
  b.addEventListener("click", onClick);
  parent.appendChild(b);
  return b;
}

function pathOf(polys) {
  return polys.map((p) => "M" + p.map(([x, y]) => `${x},${y}`).join("L") + "Z").join("");
}

class Editor {
  constructor(parent) {
    this.root = document.createElement("div");
    this.root.className = "oe";
    parent.appendChild(this.root);
    this.mode = "edit";
    this.shapes = [];
    this.sel = null;          // {key, poly, vertex}
    this.draft = [];
    this.undoStack = [];
    this.redoStack = [];
    this.view = null;         // {x, y, w, h} in photo coordinates
    this.version = null;
    this.newCount = 0;
    this.buildBar();
    this.stage = document.createElement("div");
    this.stage.className = "stage";
    this.root.appendChild(this.stage);
    this.svg = el("svg", { role: "img", "aria-label": "Photo with wound outlines", tabindex: "0" }, this.stage);
    const defs = el("defs", {}, this.svg);
    const hatch = el("pattern", { id: "oe-hatch", width: "6", height: "6", patternUnits: "userSpaceOnUse",
      patternTransform: "rotate(45)" }, defs);
    el("rect", { width: "6", height: "6", fill: "rgba(255,23,68,0.25)" }, hatch);
    el("line", { x1: "0", y1: "0", x2: "0", y2: "6", stroke: "#ff1744", "stroke-width": "3" }, hatch);
    this.img = el("image", { x: "0", y: "0", preserveAspectRatio: "none" }, this.svg);
    this.gShapes = el("g", {}, this.svg);
    this.gOverlap = el("g", {}, this.svg);
    this.gDraft = el("g", {}, this.svg);
    this.gClicks = el("g", {}, this.svg);
    this.gHandles = el("g", {}, this.svg);
    this.hint = document.createElement("div");
    this.hint.className = "hint";
    this.root.appendChild(this.hint);
    this.bindEvents();
  }

  // -- toolbar -------------------------------------------------------------------------------
  buildBar() {
    const bar = document.createElement("div");
    bar.className = "bar";
    this.root.appendChild(bar);
    const sep = () => { const s = document.createElement("span"); s.className = "sep"; bar.appendChild(s); };
    this.modeButtons = {
      edit: button("Edit vertices", "Select an outline, drag its vertices; double-click an edge to add a vertex, " +
        "Alt+click a vertex to delete it; drag the background to pan", bar, () => this.setMode("edit")),
      draw: button("Draw new", "Click around the wound; click the first point or press Enter to close",
        bar, () => this.setMode("draw")),
      click: button("Click to outline", "Click inside a wound to have its outline proposed; " +
        "a further click outside the wound removes that region", bar, () => this.setMode("click")),
    };
    this.clickTitle = this.modeButtons.click.title;
    sep();
    button("−", "Zoom out", bar, () => this.zoomBy(1 / 1.5));
    this.zoomLabel = document.createElement("span");
    this.zoomLabel.className = "zoom";
    this.zoomLabel.setAttribute("aria-live", "polite");
    bar.appendChild(this.zoomLabel);
    button("+", "Zoom in (or use the mouse wheel)", bar, () => this.zoomBy(1.5));
    button("Fit", "Show the whole photo (W in the editor: fit the outlined wounds)", bar, () => this.fit());
    sep();
    this.undoBtn = button("Undo", "Undo the last edit (Ctrl+Z)", bar, () => this.undo());
    this.redoBtn = button("Redo", "Redo (Ctrl+Y)", bar, () => this.redo());
    this.delVertexBtn = button("Delete vertex", "Delete the selected vertex (Delete key)", bar,
      () => this.deleteVertex());
    sep();
    this.saveBtn = button("Save outline", "Save the selected outline (it is checked before it is stored)", bar,
      () => this.save(), "primary");
    this.acceptBtn = button("Accept suggestion", "Store the selected suggestion (as edited, if you changed it)",
      bar, () => this.decide("accept"), "primary");
    this.rejectBtn = button("Reject suggestion", "Discard the selected suggestion", bar, () => this.decide("reject"));
  }

  setMode(mode) {
    this.mode = mode;
    if (mode !== "draw") this.draft = [];
    this.render();
  }

  // -- data from Python ------------------------------------------------------------------------
  update(data, setTrigger) {
    this.setTrigger = setTrigger;
    this.data = data;
    this.stage.style.setProperty("--oe-height", `${data.stage_height || 620}px`);
    const newImage = this.imageKey !== data.image_key;
    if (newImage) {
      this.imageKey = data.image_key;
      this.img.setAttribute("href", data.image);
      this.img.setAttribute("width", data.width);
      this.img.setAttribute("height", data.height_px);
    }
    if (this.version !== data.version || newImage) {
      this.version = data.version;
      this.shapes = JSON.parse(JSON.stringify(data.shapes || []));
      this.sel = null;
      this.draft = [];
      this.undoStack = [];
      this.redoStack = [];
      const cand = this.shapes.find((s) => s.kind === "candidate");
      if (cand) this.sel = { key: cand.key, poly: 0, vertex: null };
    }
    if (newImage || !this.view) this.fit(false);
    this.render();
  }

  // -- coordinates, zoom and pan ---------------------------------------------------------------
  toPhoto(evt) {
    const pt = this.svg.createSVGPoint();
    pt.x = evt.clientX;
    pt.y = evt.clientY;
    const p = pt.matrixTransform(this.svg.getScreenCTM().inverse());
    return [p.x, p.y];
  }

  scale() {  // screen px per photo unit
    const ctm = this.svg.getScreenCTM();
    return ctm ? ctm.a : 1;
  }

  fit(render = true) {
    this.view = { x: 0, y: 0, w: this.data.width, h: this.data.height_px };
    if (render) this.render();
  }

  fitWounds() {  // the box of every outline with a quarter of its size on each side (the whole photo if none)
    const pts = this.shapes.flatMap((s) => s.polys.flat());
    if (!pts.length) return this.fit();
    let [x0, y0, x1, y1] = [Infinity, Infinity, -Infinity, -Infinity];
    for (const [x, y] of pts) {
      x0 = Math.min(x0, x); y0 = Math.min(y0, y); x1 = Math.max(x1, x); y1 = Math.max(y1, y);
    }
    const w = Math.max((x1 - x0) * 1.5, this.data.width / MAX_ZOOM);
    const h = Math.max((y1 - y0) * 1.5, this.data.height_px / MAX_ZOOM);
    this.view = { x: (x0 + x1 - w) / 2, y: (y0 + y1 - h) / 2, w, h };
    this.render();
  }

  zoomBy(factor, centre = null) {
    const v = this.view;
    const [cx, cy] = centre || [v.x + v.w / 2, v.y + v.h / 2];
    const current = this.data.width / v.w;
    const next = Math.min(MAX_ZOOM, Math.max(0.5, current * factor));
    const f = next / current;
    this.view = { x: cx - (cx - v.x) / f, y: cy - (cy - v.y) / f, w: v.w / f, h: v.h / f };
    this.render();
  }

  // -- history ---------------------------------------------------------------------------------
  snapshot() {
    return JSON.stringify({ shapes: this.shapes, draft: this.draft, newCount: this.newCount });
  }

  remember() {
    this.undoStack.push(this.snapshot());
    this.redoStack = [];
  }

  restore(state) {
    const s = JSON.parse(state);
    this.shapes = s.shapes;
    this.draft = s.draft;
    this.newCount = s.newCount;
    if (this.sel && !this.shapes.some((x) => x.key === this.sel.key)) this.sel = null;
    if (this.sel) this.sel.vertex = null;
    this.render();
  }

  undo() {
    if (!this.undoStack.length) return;
    this.redoStack.push(this.snapshot());
    this.restore(this.undoStack.pop());
    this.say("Undone.");
  }

  redo() {
    if (!this.redoStack.length) return;
    this.undoStack.push(this.snapshot());
    this.restore(this.redoStack.pop());
    this.say("Redone.");
  }

  // -- editing ---------------------------------------------------------------------------------
  selected() {
    return this.sel ? this.shapes.find((s) => s.key === this.sel.key) : null;
  }

  deleteVertex(key = null, poly = null, vertex = null) {
    if (key === null) {
      if (!this.sel || this.sel.vertex === null) { this.say("Select a vertex first (click it).", true); return; }
      ({ key, poly, vertex } = this.sel);
    }
    const shape = this.shapes.find((s) => s.key === key);
    if (shape.polys[poly].length <= 3) {
      this.say("An outline needs at least 3 vertices; this vertex cannot be deleted.", true);
      return;
    }
    this.remember();
    shape.polys[poly].splice(vertex, 1);
    shape.dirty = true;
    this.sel = { key, poly, vertex: null };
    this.render();
  }

  nearestEdge(shape, at) {  // {poly, after, point, dist} of the edge of `shape` nearest to `at`
    let best = null;
    shape.polys.forEach((pts, poly) => {
      for (let i = 0; i < pts.length; i++) {
        const [ax, ay] = pts[i];
        const [bx, by] = pts[(i + 1) % pts.length];
        const dx = bx - ax;
        const dy = by - ay;
        const t = Math.max(0, Math.min(1, ((at[0] - ax) * dx + (at[1] - ay) * dy) / (dx * dx + dy * dy || 1)));
        const point = [ax + t * dx, ay + t * dy];
        const dist = Math.hypot(point[0] - at[0], point[1] - at[1]);
        if (!best || dist < best.dist) best = { poly, after: i, point, dist };
      }
    });
    return best;
  }

  insertVertex(shape, at) {
    const edge = this.nearestEdge(shape, at);
    if (!edge || edge.dist * this.scale() > EDGE_PX) return;
    this.remember();
    shape.polys[edge.poly].splice(edge.after + 1, 0, edge.point);
    shape.dirty = true;
    this.sel = { key: shape.key, poly: edge.poly, vertex: edge.after + 1 };
    this.render();
  }

  closeDraft() {
    if (this.draft.length < 3) {
      this.say(`An outline needs at least 3 vertices; this one has ${this.draft.length}.`, true);
      return;
    }
    this.remember();
    this.newCount += 1;
    const key = `new${this.newCount}`;
    this.shapes.push({ key, kind: "new", label: "new", colour: "#ffd700", polys: [this.draft], dirty: true });
    this.draft = [];
    this.sel = { key, poly: 0, vertex: null };
    this.mode = "edit";
    this.say("Outline closed: adjust its vertices, then Save outline.");
    this.render();
  }

  // -- actions sent to Python ------------------------------------------------------------------
  send(payload) {
    this.setTrigger("action", { ...payload, nonce: `${Date.now()}-${Math.random()}` });
  }

  save() {
    const s = this.selected();
    if (!s || s.kind === "candidate") { this.say("Select an outline you drew or edited first.", true); return; }
    this.send({ type: "save", kind: s.kind, index: s.index ?? null, polys: s.polys });
  }

  decide(type) {
    const s = this.selected();
    if (!s || s.kind !== "candidate") { this.say("Select a suggestion first.", true); return; }
    this.send({ type, id: s.id, polys: s.polys, edited: !!s.dirty });
  }

  say(text, warn = false) {
    this.hint.textContent = text;
    this.hint.classList.toggle("warn", warn);
  }

  // -- pointer and keyboard ------------------------------------------------------------------------
  bindEvents() {
    const svg = this.svg;
    svg.addEventListener("wheel", (e) => {
      e.preventDefault();
      this.zoomBy(e.deltaY < 0 ? 1.25 : 1 / 1.25, this.toPhoto(e));
    }, { passive: false });
    svg.addEventListener("contextmenu", (e) => {
      const t = e.target;
      if (t.classList.contains("vertex")) {
        e.preventDefault();
        this.deleteVertex(t.dataset.key, +t.dataset.poly, +t.dataset.i);
      }
    });
    svg.addEventListener("pointerdown", (e) => this.onDown(e));
    svg.addEventListener("pointermove", (e) => this.onMove(e));
    svg.addEventListener("pointerup", (e) => this.onUp(e));
    svg.addEventListener("keydown", (e) => this.onKey(e));
    svg.addEventListener("keyup", (e) => { if (e.key === " ") this.space = false; });
    this.root.addEventListener("keydown", (e) => { if (e.target !== svg) this.onKey(e); });
  }

  onKey(e) {
    const mod = e.ctrlKey || e.metaKey;
    if (mod && (e.key === "z" || e.key === "Z")) { e.preventDefault(); e.shiftKey ? this.redo() : this.undo(); }
    else if (mod && (e.key === "y" || e.key === "Y")) { e.preventDefault(); this.redo(); }
    else if (e.key === "Enter" && this.mode === "draw") { e.preventDefault(); this.closeDraft(); }
    else if (e.key === "Escape") { this.draft = []; this.render(); }
    else if (e.key === "Backspace" && this.mode === "draw" && this.draft.length) {
      e.preventDefault(); this.remember(); this.draft.pop(); this.render();
    } else if (e.key === "Delete" || e.key === "Backspace") { e.preventDefault(); this.deleteVertex(); }
    else if (e.key === " ") { e.preventDefault(); this.space = true; }
    else if ((e.key === "w" || e.key === "W") && !mod) { e.preventDefault(); this.fitWounds(); }
  }

  onDown(e) {
    this.svg.focus({ preventScroll: true });
    const t = e.target;
    const at = this.toPhoto(e);
    // Double clicks are detected here: every press redraws the SVG, so the browser's dblclick never fires.
    const now = performance.now();
    const last = this.lastDown;
    this.lastDown = { t: now, x: e.clientX, y: e.clientY };
    if (e.button === 0 && last && now - last.t < DOUBLE_MS && Math.hypot(e.clientX - last.x, e.clientY - last.y) < 6) {
      this.lastDown = null;
      const shape = this.selected();
      if (this.mode === "edit" && shape) { this.insertVertex(shape, at); return; }
      if (this.mode === "draw" && this.draft.length >= 3) { this.closeDraft(); return; }
    }
    if (e.button === 1 || this.space || (e.button === 0 && this.mode === "edit" && !t.dataset.key)) {
      this.pan = { from: [e.clientX, e.clientY], view: { ...this.view } };
      this.svg.setPointerCapture(e.pointerId);
      this.svg.classList.add("panning");
      return;
    }
    if (e.button !== 0) return;
    if (this.mode === "edit") {
      if (t.classList.contains("vertex")) {
        const key = t.dataset.key;
        const poly = +t.dataset.poly;
        const i = +t.dataset.i;
        if (e.altKey) { this.deleteVertex(key, poly, i); return; }
        this.sel = { key, poly, vertex: i };
        this.drag = { before: this.snapshot(), moved: false };
        this.svg.setPointerCapture(e.pointerId);
        this.render();
      } else if (t.classList.contains("shape")) {
        this.sel = { key: t.dataset.key, poly: +t.dataset.poly, vertex: null };
        const s = this.selected();
        this.say(s.kind === "candidate" ? "Suggestion selected: drag its vertices to edit, then Accept or Reject."
          : `Outline ${s.label} selected: drag a vertex, double-click an edge to add one, Alt+click to delete one.`);
        this.render();
      }
    } else if (this.mode === "draw") {
      const first = this.draft[0];
      if (first && this.draft.length >= 3 && Math.hypot(first[0] - at[0], first[1] - at[1]) * this.scale() <= CLOSE_PX) {
        this.closeDraft();
        return;
      }
      this.remember();
      this.draft.push(at);
      this.render();
    } else if (this.mode === "click") {
      if (at[0] < 0 || at[1] < 0 || at[0] > this.data.width || at[1] > this.data.height_px) return;
      this.send({ type: "click", x: at[0], y: at[1] });
      this.say("Outlining from your click…");
    }
  }

  onMove(e) {
    if (this.pan) {
      const s = this.scale();
      const { from, view } = this.pan;
      this.view = { ...view, x: view.x - (e.clientX - from[0]) / s, y: view.y - (e.clientY - from[1]) / s };
      this.render();
    } else if (this.drag && this.sel && this.sel.vertex !== null) {
      const shape = this.selected();
      shape.polys[this.sel.poly][this.sel.vertex] = this.toPhoto(e);
      shape.dirty = true;
      this.drag.moved = true;
      this.render();
    }
  }

  onUp(e) {
    if (this.pan) {
      this.pan = null;
      this.svg.classList.remove("panning");
    }
    if (this.drag) {
      if (this.drag.moved) {
        this.undoStack.push(this.drag.before);
        this.redoStack = [];
        const s = this.selected();
        this.say(s.kind === "candidate" ? "Suggestion edited: Accept stores it as edited."
          : "Vertex moved: Save outline stores it; Undo reverts.");
      }
      this.drag = null;
    }
    if (this.svg.hasPointerCapture(e.pointerId)) this.svg.releasePointerCapture(e.pointerId);
    this.render();
  }

  // -- drawing ---------------------------------------------------------------------------------
  render() {
    if (!this.data || !this.view) return;
    const v = this.view;
    this.svg.setAttribute("viewBox", `${v.x} ${v.y} ${v.w} ${v.h}`);
    this.svg.setAttribute("class", this.mode + (this.pan ? " panning" : ""));
    const zoom = this.data.width / v.w;
    this.root.dataset.zoom = zoom.toFixed(3);
    this.zoomLabel.textContent = `Zoom ${Math.round(zoom * 100)}%`;
    const clickOff = this.data.click_off || "";  // why click-to-outline is unavailable here, if it is
    if (clickOff && this.mode === "click") this.mode = "edit";
    this.modeButtons.click.disabled = !!clickOff;
    this.modeButtons.click.title = clickOff || this.clickTitle;
    for (const [m, b] of Object.entries(this.modeButtons)) b.setAttribute("aria-pressed", String(m === this.mode));
    this.undoBtn.disabled = !this.undoStack.length;
    this.redoBtn.disabled = !this.redoStack.length;
    const s = this.selected();
    this.delVertexBtn.disabled = !(this.sel && this.sel.vertex !== null);
    this.saveBtn.disabled = !(s && s.kind !== "candidate" && s.dirty);
    this.acceptBtn.disabled = this.rejectBtn.disabled = !(s && s.kind === "candidate");
    const unit = 1 / this.scale();

    this.gShapes.replaceChildren();
    this.gHandles.replaceChildren();
    for (const shape of this.shapes) {
      const isSel = this.sel && this.sel.key === shape.key;
      const g = el("g", { "data-label": shape.label }, this.gShapes);
      shape.polys.forEach((poly, pi) => {
        el("path", {
          d: pathOf([poly]), class: `shape ${shape.kind}${isSel ? " selected" : ""}`, fill: shape.colour,
          stroke: shape.colour, "data-key": shape.key, "data-poly": pi, "data-dirty": String(!!shape.dirty),
        }, g);
      });
      if (shape.polys.length) {
        const pts = shape.polys[0];
        const cx = pts.reduce((a, p) => a + p[0], 0) / pts.length;
        const cy = pts.reduce((a, p) => a + p[1], 0) / pts.length;
        const label = el("text", { x: cx, y: cy, class: "label", "font-size": 14 * unit, "text-anchor": "middle",
          "dominant-baseline": "middle" }, g);
        label.textContent = shape.label;
      }
      if (isSel && this.mode === "edit") {
        shape.polys.forEach((poly, pi) => poly.forEach(([x, y], i) => {
          const active = this.sel.poly === pi && this.sel.vertex === i;
          el("circle", { cx: x, cy: y, r: HANDLE_PX * unit, class: `vertex${active ? " active" : ""}`,
            "data-key": shape.key, "data-poly": pi, "data-i": i }, this.gHandles);
        }));
      }
    }
    this.gOverlap.replaceChildren();
    if ((this.data.overlap || []).length) {
      el("path", { d: pathOf(this.data.overlap), class: "overlap", "data-role": "overlap" }, this.gOverlap);
    }
    this.gDraft.replaceChildren();
    if (this.draft.length) {
      el("polyline", { points: this.draft.map(([x, y]) => `${x},${y}`).join(" "), class: "draft" }, this.gDraft);
      this.draft.forEach(([x, y]) => el("circle", { cx: x, cy: y, r: 4 * unit, class: "vertex" }, this.gDraft));
    }
    this.gClicks.replaceChildren();
    for (const c of this.data.clicks || []) {
      el("circle", { cx: c.x, cy: c.y, r: 6 * unit, class: "click-pt", fill: c.include ? "#00c853" : "#ff1744" },
        this.gClicks);
    }
  }
}

export default function (component) {
  const { data, parentElement, setTriggerValue } = component;
  let editor = parentElement.__outlineEditor;
  if (!editor || !editor.root.isConnected) {
    editor = new Editor(parentElement);
    parentElement.__outlineEditor = editor;
  }
  editor.update(data, setTriggerValue);
}
