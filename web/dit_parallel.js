// ComfyUI front-end extension of dit-parallel: the status panel (worker pools, devices, layout, and per rank
// its state, step/patch progress and memory) fed by "dit_parallel.status" server events, and the text shown
// on the loader, sampler and model-sampling nodes after they ran. State logic: ./status_model.js.
//
// The panel is a sidebar tab ("DiT Parallel", like ComfyUI's Queue or Model Library tabs), so it never
// covers the canvas, its minimap or its buttons. Front-ends without sidebar tabs get a floating panel that
// can be dragged by its title (the place is remembered) and starts at the top left of the canvas.
// DOM contract (tests read it): #dit-parallel-status > .dit-parallel-pool[data-pool] >
// .dit-parallel-rank[data-rank][data-device][data-state][data-memory][data-step][data-total].

import { app } from "../../scripts/app.js";
import { api } from "../../scripts/api.js";
import { initialState, reduce, toView } from "./status_model.js";

const EVENT = "dit_parallel.status";
const TAB_ID = "dit-parallel";
const PLACE_KEY = "dit_parallel.panel_place";
const TEXT_NODES = new Set([
  "DiTParallelModelLoader",
  "DiTParallelUnload",
  "DiTParallelSampler", // the model sampling in force
  "DiTParallelModelSamplingFlux",
  "DiTParallelModelSamplingSD3",
  "DiTParallelModelSamplingAuraFlow",
  "DiTParallelEasyCache", // the cache's settings
  "DiTParallelLazyCache",
  "DiTParallelBlockCache",
]);

function el(tag, props = {}, children = []) {
  const node = document.createElement(tag);
  for (const [key, value] of Object.entries(props)) {
    if (key === "style") Object.assign(node.style, value);
    else if (key === "text") node.textContent = value;
    else if (key === "data") Object.assign(node.dataset, value);
    else node[key] = value;
  }
  for (const child of children) if (child) node.append(child);
  return node;
}

function renderRank(rank, raw) {
  const bar = el("div", { style: { height: "4px", background: "#444", borderRadius: "2px", marginTop: "2px" } }, [
    el("div", { style: { width: `${rank.percent}%`, height: "100%", background: "#4a9eff", borderRadius: "2px" } }),
  ]);
  const parts = [`rank ${rank.rank} · ${rank.device} · ${rank.state}`];
  if (rank.step) parts.push(`step ${rank.step}`);
  if (rank.patch) parts.push(`patch ${rank.patch}`);
  if (rank.memory) parts.push(rank.memory);
  const data = { rank: String(rank.rank), device: rank.device, state: rank.state, memory: rank.memory };
  if (typeof raw?.step === "number") Object.assign(data, { step: String(raw.step), total: String(raw.total ?? "") });
  return el("div", { className: "dit-parallel-rank", data, style: { margin: "4px 0" } }, [
    el("div", { text: parts.join(" · ") }),
    bar,
  ]);
}

function renderPool(pool, rawPool) {
  return el("div", { className: "dit-parallel-pool", data: { pool: pool.id }, style: { borderTop: "1px solid #555", padding: "6px 0" } }, [
    el("div", { text: pool.title, style: { fontWeight: "bold" } }),
    el("div", { text: `${pool.layout} on ${pool.devices}`, title: pool.reason }),
    el("div", { className: "dit-parallel-job", text: pool.job, style: { opacity: pool.busy ? "1" : "0.7" } }),
    ...pool.ranks.map((rank) => renderRank(rank, rawPool?.ranks?.[String(rank.rank)])),
  ]);
}

/** The panel's content; ``update(state)`` redraws it. */
function createPanel() {
  const body = el("div");
  const unload = el("button", { text: "Unload workers", title: "Stop every worker process and free the GPUs" });
  unload.onclick = () => api.fetchApi("/dit_parallel/unload", { method: "POST" }).catch(() => {});
  const header = el("div", { style: { display: "flex", alignItems: "center", gap: "6px" } }, [
    el("span", { text: "DiT Parallel", style: { fontWeight: "bold", flex: "1" } }),
    unload,
  ]);
  const empty = el("div", { text: "No worker pool yet: run a Parallel Model Loader.", style: { opacity: "0.7" } });
  const root = el("div", { id: "dit-parallel-status", style: { font: "12px sans-serif", padding: "8px" } }, [
    header,
    body,
  ]);
  const update = (state) => {
    const view = toView(state);
    body.replaceChildren(...(view.empty ? [empty] : view.pools.map((p) => renderPool(p, state.pools[p.id]))));
  };
  return { root, header, update };
}

/** Front-ends without sidebar tabs: a floating panel, dragged by its header, away from the minimap. */
function floatPanel(panel) {
  const place = JSON.parse(localStorage.getItem(PLACE_KEY) ?? "null") ?? { left: 80, top: 90 };
  const box = el("div", {
    style: {
      position: "fixed", left: `${place.left}px`, top: `${place.top}px`, zIndex: 1000, width: "320px",
      maxHeight: "50vh", overflowY: "auto", background: "rgba(30,30,30,0.92)", color: "#ddd",
      borderRadius: "6px", boxShadow: "0 2px 8px rgba(0,0,0,0.5)",
    },
  }, [panel.root]);
  panel.header.style.cursor = "move";
  panel.header.onpointerdown = (down) => {
    if (down.target.tagName === "BUTTON") return;
    const start = { x: down.clientX, y: down.clientY, left: box.offsetLeft, top: box.offsetTop };
    const move = (e) => {
      box.style.left = `${Math.max(0, start.left + e.clientX - start.x)}px`;
      box.style.top = `${Math.max(0, start.top + e.clientY - start.y)}px`;
    };
    const up = () => {
      window.removeEventListener("pointermove", move);
      window.removeEventListener("pointerup", up);
      localStorage.setItem(PLACE_KEY, JSON.stringify({ left: box.offsetLeft, top: box.offsetTop }));
    };
    window.addEventListener("pointermove", move);
    window.addEventListener("pointerup", up);
  };
  document.body.append(box);
}

app.registerExtension({
  name: "dit_parallel.status_panel",

  async setup() {
    let state = initialState();
    const panel = createPanel();
    let queued = false;
    const render = () => {
      if (queued) return; // a burst of events (every rank, every step) draws once
      queued = true;
      setTimeout(() => {
        queued = false;
        panel.update(state);
      }, 50);
    };
    api.addEventListener(EVENT, (event) => {
      state = reduce(state, event.detail);
      render();
    });
    const sidebar = app.extensionManager?.registerSidebarTab;
    if (sidebar) {
      app.extensionManager.registerSidebarTab({
        id: TAB_ID,
        icon: "pi pi-server",
        title: "DiT Parallel",
        tooltip: "DiT Parallel: worker pools, devices, progress and memory per rank",
        type: "custom",
        render: (container) => {
          container.replaceChildren(panel.root);
          render();
        },
      });
    } else {
      floatPanel(panel);
    }
    render();
    try {
      const response = await api.fetchApi("/dit_parallel/status");
      if (response.ok) {
        state = reduce(state, await response.json());
        render();
      }
    } catch {
      // server without the route (older pack version): events alone fill the panel
    }
  },

  async beforeRegisterNodeDef(nodeType, nodeData) {
    if (!TEXT_NODES.has(nodeData.name)) return;
    const onExecuted = nodeType.prototype.onExecuted;
    nodeType.prototype.onExecuted = function (message) {
      onExecuted?.apply(this, arguments);
      const text = message?.text?.join("\n");
      if (!text) return;
      let widget = this.widgets?.find((w) => w.name === "dit_parallel_info");
      if (!widget) {
        widget = this.addWidget("text", "dit_parallel_info", "", () => {}, { serialize: false });
        widget.serialize = false; // not part of the saved workflow's widgets_values
      }
      widget.value = text;
      this.setDirtyCanvas?.(true, true);
    };
  },
});
