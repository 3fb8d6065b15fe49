// Tests of the status panel's reducer and view model (run: node --test web/tests).
import assert from "node:assert/strict";
import { readFileSync } from "node:fs";
import { test } from "node:test";

import { formatBytes, initialState, reduce, toView } from "../status_model.js";

const GIB = 1024 ** 3;
const poolEvent = {
  type: "pool",
  pool: "p1",
  model: "FLUX.1-dev",
  family: "flux",
  devices: ["cuda:0", "cuda:1"],
  layout: "ulysses=2",
  reason: "ulysses=2: 2 GPUs; NVLink/P2P",
  state: "ready",
};

const fold = (events) => events.reduce(reduce, initialState());

test("empty state renders an empty view", () => {
  const view = toView(initialState());
  assert.equal(view.empty, true);
  assert.deepEqual(view.pools, []);
});

test("a loaded pool lists its devices, layout and one row per rank", () => {
  const view = toView(fold([poolEvent]));
  assert.equal(view.empty, false);
  const [pool] = view.pools;
  assert.equal(pool.title, "FLUX.1-dev (flux)");
  assert.equal(pool.layout, "ulysses=2");
  assert.equal(pool.devices, "cuda:0, cuda:1");
  assert.equal(pool.job, "idle");
  assert.deepEqual(
    pool.ranks.map((r) => [r.rank, r.device, r.step]),
    [
      [0, "cuda:0", ""],
      [1, "cuda:1", ""],
    ],
  );
});

test("progress per rank with patches, and the percent bar", () => {
  const state = fold([
    poolEvent,
    { type: "job", pool: "p1", job: "sample", state: "running" },
    { type: "progress", pool: "p1", rank: 0, step: 5, total: 20 },
    { type: "progress", pool: "p1", rank: 1, step: 4, total: 20, patch: 1, patches: 4 },
  ]);
  const [pool] = toView(state).pools;
  assert.equal(pool.job, "sampling");
  assert.equal(pool.busy, true);
  assert.equal(pool.ranks[0].step, "5/20");
  assert.equal(pool.ranks[0].percent, 25);
  assert.equal(pool.ranks[1].patch, "2/4");
  assert.equal(pool.ranks[1].percent, 20);
});

test("memory per worker is formatted; a new job clears counters but keeps memory", () => {
  let state = fold([
    poolEvent,
    { type: "job", pool: "p1", job: "sample", state: "running" },
    { type: "progress", pool: "p1", rank: 0, step: 20, total: 20 },
    { type: "memory", pool: "p1", rank: 0, memory: { allocated_bytes: 3.5 * GIB, total_bytes: 24 * GIB, peak_bytes: 5 * GIB } },
    { type: "memory", pool: "p1", rank: 1, memory: { rss_bytes: 512 * 1024 ** 2 } },
    { type: "job", pool: "p1", job: "sample", state: "done" },
  ]);
  let [pool] = toView(state).pools;
  assert.equal(pool.job, "sampling done");
  assert.equal(pool.ranks[0].memory, "3.5 GiB / 24.0 GiB (peak 5.0 GiB)");
  assert.equal(pool.ranks[1].memory, "RAM 512 MiB");
  state = reduce(state, { type: "job", pool: "p1", job: "sample", state: "running" });
  [pool] = toView(state).pools;
  assert.equal(pool.ranks[0].step, "");
  assert.equal(pool.ranks[0].memory, "3.5 GiB / 24.0 GiB (peak 5.0 GiB)");
});

test("errors and cancels are shown with the first line of the message", () => {
  const state = fold([
    poolEvent,
    { type: "job", pool: "p1", job: "sample", state: "error", message: "job 'sample' failed on rank 1: OOM\n  why: ..." },
  ]);
  assert.equal(toView(state).pools[0].job, "sampling failed: job 'sample' failed on rank 1: OOM");
  const cancelled = reduce(state, { type: "job", pool: "p1", job: "sample", state: "cancelled" });
  assert.equal(toView(cancelled).pools[0].job, "sampling cancelled");
});

test("pool_closed and reset remove pools; events for unknown pools are ignored", () => {
  const two = fold([poolEvent, { ...poolEvent, pool: "p2", model: "tiny-sd3", family: "sd3" }]);
  assert.deepEqual(
    toView(two).pools.map((p) => p.id),
    ["p1", "p2"],
  );
  const one = reduce(two, { type: "pool_closed", pool: "p1" });
  assert.deepEqual(
    toView(one).pools.map((p) => p.id),
    ["p2"],
  );
  assert.equal(reduce(one, { type: "progress", pool: "nope", rank: 0, step: 1, total: 2 }), one);
  assert.equal(reduce(one, { type: "whatever" }), one);
  assert.equal(reduce(one, null), one);
  assert.equal(toView(reduce(one, { type: "reset" })).empty, true);
});

test("a snapshot replaces the state (panel opened late)", () => {
  const snapshot = {
    type: "snapshot",
    pools: [
      {
        pool: "p9",
        model: "tiny-pixart",
        family: "pixart",
        devices: ["cpu", "cpu"],
        layout: "pp=2",
        reason: "r",
        state: "ready",
        job: { job: "sample", state: "running" },
        ranks: { 1: { step: 3, total: 8, patch: 0, patches: 2 } },
      },
    ],
  };
  const view = toView(reduce(fold([poolEvent]), snapshot));
  assert.deepEqual(
    view.pools.map((p) => p.id),
    ["p9"],
  );
  assert.equal(view.pools[0].ranks[1].step, "3/8");
  assert.equal(view.pools[0].ranks[1].patch, "1/2");
  assert.equal(view.pools[0].job, "sampling");
});

test("reduce never mutates its input", () => {
  const before = fold([poolEvent]);
  const frozen = JSON.stringify(before);
  reduce(before, { type: "progress", pool: "p1", rank: 0, step: 1, total: 2 });
  reduce(before, { type: "pool_closed", pool: "p1" });
  assert.equal(JSON.stringify(before), frozen);
});

test("formatBytes", () => {
  assert.equal(formatBytes(2 * GIB), "2.0 GiB");
  assert.equal(formatBytes(300 * 1024 ** 2), "300 MiB");
  assert.equal(formatBytes(undefined), "");
});

test("the extension listens to the event the server sends and imports the model module", () => {
  const source = readFileSync(new URL("../dit_parallel.js", import.meta.url), "utf8");
  const python = readFileSync(new URL("../../nodes/bridge.py", import.meta.url), "utf8");
  const name = python.match(/STATUS_EVENT = "([^"]+)"/)[1];
  assert.ok(source.includes(`const EVENT = "${name}"`), `extension must listen to ${name}`);
  assert.ok(source.includes('from "./status_model.js"'));
  assert.ok(source.includes("app.registerExtension"));
});

test("each rank has its own state, step and memory", () => {
  let state = fold([
    poolEvent,
    { type: "job", pool: "p1", job: "sample", state: "running" },
    { type: "progress", pool: "p1", rank: 1, step: 3, total: 20 },
    { type: "memory", pool: "p1", rank: 1, memory: { rss_bytes: 256 * 1024 ** 2 } },
  ]);
  let [pool] = toView(state).pools;
  assert.deepEqual(
    pool.ranks.map((r) => [r.rank, r.state, r.step, r.memory]),
    [
      [0, "waiting", "", ""],
      [1, "sampling", "3/20", "RAM 256 MiB"],
    ],
  );
  state = reduce(state, { type: "job", pool: "p1", job: "sample", state: "done" });
  [pool] = toView(state).pools;
  assert.deepEqual(
    pool.ranks.map((r) => r.state),
    ["ready", "ready"],
  );
  state = reduce(state, { type: "job", pool: "p1", job: "decode", state: "running" });
  [pool] = toView(state).pools;
  assert.deepEqual(
    pool.ranks.map((r) => r.state),
    ["decoding", "decoding"],
  );
});
