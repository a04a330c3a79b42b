// Builds the console into ../queue_service/console_assets (committed, so `pip install` needs no
// Node). The output is deterministic: CI rebuilds it and fails when the committed copy differs.
// The contract's code comes from the TypeScript client's source (clients/typescript/src, through
// the "@acurio/queue-client/*" path in tsconfig.json, which esbuild follows).
import { build } from "esbuild";
import { copyFileSync, mkdirSync, rmSync } from "node:fs";
import { dirname, join, sep } from "node:path";
import { fileURLToPath } from "node:url";

const root = dirname(dirname(fileURLToPath(import.meta.url)));
const out = join(root, "..", "queue_service", "console_assets");

// A package the client's source imports (@bufbuild/protobuf, @connectrpc/connect) would resolve
// from clients/typescript/node_modules, bundling a second copy of it: resolve it from the
// console's own node_modules instead (the two lock files pin the same versions), so the bundle
// holds one copy and depends on the console's lock file alone.
const client = join(root, "..", "clients", "typescript") + sep;
const ownPackages = {
  name: "own-packages",
  setup(build) {
    build.onResolve({ filter: /^[@a-z]/ }, (args) => {
      if (!args.importer.startsWith(client)) return undefined;
      return build.resolve(args.path, { kind: args.kind, resolveDir: join(root, "src") });
    });
  },
};

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
  plugins: [ownPackages],
});
copyFileSync(join(root, "src", "index.html"), join(out, "index.html"));
copyFileSync(join(root, "src", "console.css"), join(out, "console.css"));
