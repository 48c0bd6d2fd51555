// What every peer run shares: the arguments, the clock, the exactly-once tally and
// the one JSON line a run prints for `run` to tabulate.
"use strict";

function args() {
  const [url, jobs, concurrency, batch = "1"] = process.argv.slice(2);
  const [n, c, b] = [jobs, concurrency, batch].map(Number);
  if (!url || ![n, c, b].every((x) => Number.isInteger(x) && x >= 1)) {
    console.error(`usage: node ${process.argv[1]} POSTGRES_URL JOBS CONCURRENCY [BATCH]`);
    process.exit(2);
  }
  return { url, jobs: n, concurrency: c, batch: b };
}

// Counts each job id's executions; `done` resolves once `jobs` distinct ids ran.
function tally(jobs) {
  const runs = new Map();
  let resolve;
  const done = new Promise((r) => (resolve = r));
  return {
    done,
    ran(id) {
      runs.set(id, (runs.get(id) || 0) + 1);
      if (runs.size === jobs) resolve();
    },
    // Every id ran once, and the database holds nothing unfinished.
    exactlyOnce(unfinished) {
      const twice = [...runs.values()].filter((k) => k !== 1).length;
      return runs.size === jobs && twice === 0 && unfinished === 0;
    },
  };
}

// Waits until the database holds no unfinished job (`count` answers how many),
// polling every 5 ms for at most 60 s: a run ends when its completions are durable.
async function drained(count) {
  const deadline = Date.now() + 60_000;
  let left = await count();
  while (left > 0 && Date.now() < deadline) {
    await new Promise((r) => setTimeout(r, 5));
    left = await count();
  }
  return left;
}

function report(system, jobs, concurrency, seconds, exactlyOnce) {
  const line = { system, jobs, concurrency, seconds, jobs_per_s: jobs / seconds, exactly_once: exactlyOnce };
  console.log(JSON.stringify(line));
  if (!exactlyOnce) process.exitCode = 1;
}

module.exports = { args, tally, drained, report };
