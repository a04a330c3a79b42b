// Builds the console into ../queue_service/console_assets (committed, so `pip install` needs no
// Node). The output is deterministic: CI rebuilds it and fails when the committed copy differs.
import { build } from "esbuild";
import { copyFileSync, mkdirSync, rmSync } from "node:fs";
import { dirname, join } from "node:path";
import { fileURLToPath } from "node:url";

const root = dirname(dirname(fileURLToPath(import.meta.url)));
const out = join(root, "..", "queue_service", "console_assets");

rmSync(out, { recursive: true, force: true });
mkdirSync(out, { recursive: true });
await build({
  entryPoints: [join(root, "src", "main.tsx")],
  bundle: true,
  minify: true,
  format: "esm",
  target: "es2022",
  jsx: "automatic",
  jsxImportSource: "preact",
  outfile: join(out, "console.js"),
  legalComments: "none",
  logLevel: "warning",
});
copyFileSync(join(root, "src", "index.html"), join(out, "index.html"));
copyFileSync(join(root, "src", "console.css"), join(out, "console.css"));
