// State of the DiT Parallel status panel: a reducer over "dit_parallel.status" server events and
// the view model the panel renders. Plain ES module without DOM or ComfyUI imports, so Node's
// test runner can check it (web/tests). Event shapes are documented in nodes/status.py.

const GIB = 1024 ** 3;

/** The empty panel state. */
export function initialState() {
  return { pools: {}, order: [] };
}

function withPool(state, id, update) {
  const current = state.pools[id] ?? { id, ranks: {}, job: null, devices: [] };
  const pools = { ...state.pools, [id]: update(current) };
  const order = state.order.includes(id) ? state.order : [...state.order, id];
  return { pools, order };
}

function withRank(state, event, values) {
  if (!(event.pool in state.pools)) return state; // progress for a pool we never saw: ignore
  const rank = String(event.rank);
  return withPool(state, event.pool, (pool) => ({
    ...pool,
    ranks: { ...pool.ranks, [rank]: { ...(pool.ranks[rank] ?? {}), ...values } },
  }));
}

function pick(source, keys) {
  const out = {};
  for (const key of keys) {
    if (typeof source[key] === "number" && Number.isFinite(source[key])) out[key] = source[key];
  }
  return out;
}

/** Fold one server event into the state (returns a new state; unknown events change nothing). */
export function reduce(state, event) {
  if (!event || typeof event !== "object") return state;
  switch (event.type) {
    case "snapshot": {
      let next = initialState();
      for (const pool of event.pools ?? []) {
        next = reduce(next, { ...pool, type: "pool" });
        next = withPool(next, pool.pool, (p) => ({ ...p, ranks: { ...(pool.ranks ?? {}) }, job: pool.job ?? null }));
      }
      return next;
    }
    case "reset":
      return initialState();
    case "pool":
      if (typeof event.pool !== "string") return state;
      return withPool(state, event.pool, (pool) => ({
        ...pool,
        model: event.model ?? pool.model,
        family: event.family ?? pool.family,
        devices: Array.isArray(event.devices) ? [...event.devices] : pool.devices,
        layout: event.layout ?? pool.layout,
        reason: event.reason ?? pool.reason,
        state: event.state ?? "ready",
      }));
    case "pool_closed": {
      if (!(event.pool in state.pools)) return state;
      const pools = { ...state.pools };
      delete pools[event.pool];
      return { pools, order: state.order.filter((id) => id !== event.pool) };
    }
    case "job": {
      if (!(event.pool in state.pools)) return state;
      return withPool(state, event.pool, (pool) => {
        const job = { job: event.job, state: event.state };
        if (event.message) job.message = event.message;
        let ranks = pool.ranks;
        if (event.state === "running") {
          // A new job: forget the previous job's step/patch counters, keep memory.
          ranks = Object.fromEntries(
            Object.entries(ranks).map(([r, v]) => [r, v.memory ? { memory: v.memory } : {}]),
          );
        }
        return { ...pool, job, ranks };
      });
    }
    case "progress":
      return withRank(state, event, pick(event, ["step", "total", "patch", "patches"]));
    case "memory":
      return withRank(state, event, {
        memory: pick(event.memory ?? {}, ["allocated_bytes", "peak_bytes", "free_bytes", "total_bytes", "rss_bytes"]),
      });
    default:
      return state;
  }
}

/** "3.2 GiB" (or MiB below 1 GiB); "" for anything that is not a number. */
export function formatBytes(bytes) {
  if (typeof bytes !== "number" || !Number.isFinite(bytes)) return "";
  if (bytes >= GIB) return `${(bytes / GIB).toFixed(1)} GiB`;
  return `${Math.round(bytes / 1024 ** 2)} MiB`;
}

function memoryText(memory) {
  if (!memory) return "";
  if (typeof memory.allocated_bytes === "number") {
    const total = typeof memory.total_bytes === "number" ? ` / ${formatBytes(memory.total_bytes)}` : "";
    const peak = typeof memory.peak_bytes === "number" ? ` (peak ${formatBytes(memory.peak_bytes)})` : "";
    return `${formatBytes(memory.allocated_bytes)}${total}${peak}`;
  }
  if (typeof memory.rss_bytes === "number") return `RAM ${formatBytes(memory.rss_bytes)}`;
  return "";
}

const JOB_WORDS = { sample: "sampling", decode: "decoding", encode: "encoding" };

function jobText(job) {
  if (!job) return "idle";
  const what = JOB_WORDS[job.job] ?? job.job;
  if (job.state === "running") return what;
  if (job.state === "done") return `${what} done`;
  if (job.state === "cancelled") return `${what} cancelled`;
  if (job.state === "error") return `${what} failed${job.message ? `: ${job.message.split("\n")[0]}` : ""}`;
  return `${what} ${job.state}`;
}

/** What one rank is doing: "ready" between jobs; while a job runs its word ("sampling",
 * "decoding", ...), or "waiting" while a sampling rank has not reported its first step. */
function rankState(pool, rank) {
  const job = pool.job;
  if (job?.state !== "running") return "ready";
  if (job.job === "sample" && typeof rank.step !== "number") return "waiting";
  return JOB_WORDS[job.job] ?? job.job;
}

/** The view model: one entry per pool with ready-to-show strings and a percent per rank. */
export function toView(state) {
  const pools = state.order
    .filter((id) => id in state.pools)
    .map((id) => {
      const pool = state.pools[id];
      const devices = pool.devices ?? [];
      const rankIds = new Set([...devices.map((_, i) => String(i)), ...Object.keys(pool.ranks)]);
      const ranks = [...rankIds]
        .map(Number)
        .sort((a, b) => a - b)
        .map((rank) => {
          const r = pool.ranks[String(rank)] ?? {};
          const hasStep = typeof r.step === "number" && typeof r.total === "number" && r.total > 0;
          return {
            rank,
            device: devices[rank] ?? "?",
            state: rankState(pool, r),
            step: hasStep ? `${r.step}/${r.total}` : "",
            patch: typeof r.patch === "number" && typeof r.patches === "number" ? `${r.patch + 1}/${r.patches}` : "",
            memory: memoryText(r.memory),
            percent: hasStep ? Math.max(0, Math.min(100, Math.round((100 * r.step) / r.total))) : 0,
          };
        });
      return {
        id,
        title: pool.family ? `${pool.model ?? "model"} (${pool.family})` : (pool.model ?? id),
        layout: pool.layout ?? "",
        reason: pool.reason ?? "",
        devices: devices.join(", "),
        job: jobText(pool.job),
        busy: pool.job?.state === "running",
        ranks,
      };
    });
  return { empty: pools.length === 0, pools };
}
