// Fails when the built assets (queue_service/console_assets) differ from what is committed: run
// `npm run build` and commit. The console has no generated code of its own: it builds from the
// TypeScript client's (clients/typescript/src/gen), so that is checked first (`npm ci` in
// clients/typescript provides buf), and a proto change reaches the assets through it.
import { execFileSync } from "node:child_process";

const run = (cmd, args, options = {}) => {
  try {
    execFileSync(cmd, args, { stdio: "inherit", ...options });
  } catch {
    process.exit(1); // the command has said why
  }
};
run("npm", ["run", "-s", "check:generated"], { cwd: "../clients/typescript" });
run("npm", ["run", "-s", "build"]);
const stale = execFileSync("git", ["status", "--porcelain", "--", "../queue_service/console_assets"], {
  encoding: "utf8",
});
if (stale.trim() !== "") {
  console.error(stale);
  console.error("console: built assets are stale; run `npm run build` and commit");
  process.exit(1);
}
console.log("console: built assets are fresh");
