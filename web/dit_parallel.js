// ComfyUI front-end extension of dit-parallel: a small status panel (worker pools, devices,
// layout, memory and step/patch progress per rank) fed by "dit_parallel.status" server events,
// and the layout text shown on the loader node after it ran. State logic: ./status_model.js.

import { app } from "../../scripts/app.js";
import { api } from "../../scripts/api.js";
import { initialState, reduce, toView } from "./status_model.js";

const EVENT = "dit_parallel.status";
const TEXT_NODES = new Set(["DiTParallelModelLoader", "DiTParallelUnload"]);

function el(tag, props = {}, children = []) {
  const node = document.createElement(tag);
  for (const [key, value] of Object.entries(props)) {
    if (key === "style") Object.assign(node.style, value);
    else if (key === "text") node.textContent = value;
    else node[key] = value;
  }
  for (const child of children) if (child) node.append(child);
  return node;
}

function renderRank(rank) {
  const bar = el("div", { style: { height: "4px", background: "#444", borderRadius: "2px", marginTop: "2px" } }, [
    el("div", { style: { width: `${rank.percent}%`, height: "100%", background: "#4a9eff", borderRadius: "2px" } }),
  ]);
  const parts = [`rank ${rank.rank} · ${rank.device}`];
  if (rank.step) parts.push(`step ${rank.step}`);
  if (rank.patch) parts.push(`patch ${rank.patch}`);
  if (rank.memory) parts.push(rank.memory);
  return el("div", { style: { margin: "4px 0" } }, [el("div", { text: parts.join(" · ") }), bar]);
}

function renderPool(pool) {
  return el("div", { style: { borderTop: "1px solid #555", padding: "6px 0" } }, [
    el("div", { text: pool.title, style: { fontWeight: "bold" } }),
    el("div", { text: `${pool.layout} on ${pool.devices}`, title: pool.reason }),
    el("div", { text: pool.job, style: { opacity: pool.busy ? "1" : "0.7" } }),
    ...pool.ranks.map(renderRank),
  ]);
}

function createPanel() {
  const body = el("div");
  const toggle = el("button", { text: "–", title: "Collapse", style: { marginLeft: "8px" } });
  const unload = el("button", { text: "Unload workers", title: "Stop every worker process and free the GPUs" });
  const header = el("div", { style: { display: "flex", alignItems: "center", gap: "6px" } }, [
    el("span", { text: "DiT Parallel", style: { fontWeight: "bold", flex: "1" } }),
    unload,
    toggle,
  ]);
  const panel = el(
    "div",
    {
      id: "dit-parallel-status",
      style: {
        position: "fixed", right: "12px", bottom: "12px", zIndex: 1000, width: "320px", maxHeight: "50vh",
        overflowY: "auto", background: "rgba(30,30,30,0.92)", color: "#ddd", font: "12px sans-serif",
        padding: "8px", borderRadius: "6px", boxShadow: "0 2px 8px rgba(0,0,0,0.5)", display: "none",
      },
    },
    [header, body],
  );
  let collapsed = false;
  toggle.onclick = () => {
    collapsed = !collapsed;
    body.style.display = collapsed ? "none" : "block";
    toggle.textContent = collapsed ? "+" : "–";
  };
  unload.onclick = () => api.fetchApi("/dit_parallel/unload", { method: "POST" }).catch(() => {});
  document.body.append(panel);
  return { panel, body };
}

app.registerExtension({
  name: "dit_parallel.status_panel",

  async setup() {
    let state = initialState();
    const { panel, body } = createPanel();
    const render = () => {
      const view = toView(state);
      panel.style.display = view.empty ? "none" : "block";
      body.replaceChildren(...view.pools.map(renderPool));
    };
    api.addEventListener(EVENT, (event) => {
      state = reduce(state, event.detail);
      render();
    });
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
