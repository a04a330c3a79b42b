// Fails when src/gen differs from a fresh `buf generate` (stale, hand-edited or extra files).
// Generates into a temporary directory, so the work tree is never touched. Needs no git.
import { execFileSync } from "node:child_process";
import { mkdtempSync, readdirSync, readFileSync, rmSync, statSync } from "node:fs";
import { tmpdir } from "node:os";
import { join, relative } from "node:path";

function listFiles(dir) {
  const out = [];
  const walk = (d) => {
    for (const name of readdirSync(d)) {
      const p = join(d, name);
      if (statSync(p).isDirectory()) walk(p);
      else out.push(relative(dir, p));
    }
  };
  walk(dir);
  return out.sort();
}

const tmp = mkdtempSync(join(tmpdir(), "queue-client-gen-"));
try {
  execFileSync("npx", ["--no-install", "buf", "generate", "--template", "buf.gen.yaml", "-o", tmp], {
    stdio: "inherit",
  });
  const fresh = join(tmp, "src", "gen");
  const committed = join("src", "gen");
  const a = listFiles(fresh);
  const b = listFiles(committed);
  const problems = [];
  for (const f of a) if (!b.includes(f)) problems.push(`missing: src/gen/${f}`);
  for (const f of b) if (!a.includes(f)) problems.push(`extra:   src/gen/${f}`);
  for (const f of a.filter((f) => b.includes(f))) {
    if (!readFileSync(join(fresh, f)).equals(readFileSync(join(committed, f)))) {
      problems.push(`differs: src/gen/${f}`);
    }
  }
  if (problems.length > 0) {
    console.error(`src/gen is not fresh; run \`npm run generate\`:\n  ${problems.join("\n  ")}`);
    process.exit(1);
  }
  console.log(`src/gen is fresh (${a.length} files).`);
} finally {
  rmSync(tmp, { recursive: true, force: true });
}
