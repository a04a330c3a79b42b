// Fails when the generated code (src/gen) or the built assets (queue_service/console_assets)
// differ from what is committed: run `npm run generate && npm run build` and commit.
import { execFileSync } from "node:child_process";

const run = (cmd, args) => execFileSync(cmd, args, { stdio: "inherit" });
run("npm", ["run", "-s", "generate"]);
run("npm", ["run", "-s", "build"]);
const stale = execFileSync("git", ["status", "--porcelain", "--", "src/gen", "../queue_service/console_assets"], {
  encoding: "utf8",
});
if (stale.trim() !== "") {
  console.error(stale);
  console.error("console: generated code or built assets are stale; run `npm run generate && npm run build` and commit");
  process.exit(1);
}
console.log("console: generated code and built assets are fresh");
