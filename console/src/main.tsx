import { render } from "preact";
import { useEffect, useLayoutEffect, useState } from "preact/hooks";

import { callHealth, onCallHealth, setToken, token } from "./api.js";
import { Modal } from "./dialog.js";
import { go, useRoute, useVisible } from "./hooks.js";
import { JobDetail, JobsPage } from "./jobs.js";
import { LedgerPage } from "./ledger.js";
import { ReplicasPage } from "./replicas.js";
import { OverviewPage } from "./overview.js";
import { Notice, NoticeProvider } from "./notice.js";
import { SettingsPage } from "./settings.js";
import { UserQueuePage } from "./user-queue.js";
import { visibleText } from "./user-text.js";

const PAGES = [
  { key: "1", path: "", label: "Overview" },
  { key: "2", path: "jobs", label: "Jobs" },
  { key: "3", path: "users", label: "User queue" },
  { key: "4", path: "ledger", label: "Ledger" },
  { key: "5", path: "replicas", label: "Replicas" },
  { key: "6", path: "settings", label: "Settings & audit" },
];

function TokenDialog({ onClose }: { onClose: () => void }) {
  const [value, setValue] = useState(token());
  return (
    <Modal label="Bearer token" onClose={onClose}>
      <form
        onSubmit={(e) => {
          e.preventDefault();
          setToken(value);
          onClose();
          window.location.reload();
        }}
      >
        <h2>Bearer token</h2>
        <p class="muted">
          Sent as <code>authorization: Bearer …</code> on every call, kept for this tab only. The token's role decides what
          you may do, exactly as over gRPC. Leave empty when the service runs without authentication.
        </p>
        <input
          name="token"
          type="password"
          data-autofocus
          autoComplete="off"
          value={value}
          // Selected on focus: a pasted token replaces the one set instead of joining it.
          onFocus={(e) => e.currentTarget.select()}
          onInput={(e) => setValue(e.currentTarget.value)}
          placeholder="token"
        />
        <div class="actions">
          <button type="button" onClick={onClose}>
            Close <kbd>Esc</kbd>
          </button>
          <button type="submit" class="primary">
            Use token
          </button>
        </div>
      </form>
    </Modal>
  );
}

const SHORTCUTS: [string, string][] = [
  ["1 – 6", "Overview, Jobs, User queue, Ledger, Replicas, Settings & audit"],
  ["/", "the page's search field"],
  ["t", "set the bearer token"],
  ["Enter", "open the focused row"],
  ["Esc", "close a dialog; leave a field; from a job, back to the jobs"],
  ["?", "this help"],
];

function HelpDialog({ onClose }: { onClose: () => void }) {
  return (
    <Modal label="Keyboard shortcuts" onClose={onClose}>
      <h2>Keyboard shortcuts</h2>
      <dl class="shortcuts" data-testid="shortcuts">
        {SHORTCUTS.map(([keys, what]) => (
          <>
            <dt>
              <kbd>{keys}</kbd>
            </dt>
            <dd>{what}</dd>
          </>
        ))}
      </dl>
      <div class="actions">
        <button type="button" onClick={onClose} data-autofocus>
          Close <kbd>Esc</kbd>
        </button>
      </div>
    </Modal>
  );
}

/** The header's mark: live only while the page's reads and streams are answered. */
function LiveMark({ visible }: { visible: boolean }) {
  const [health, setHealth] = useState(callHealth());
  useEffect(() => onCallHealth(setHealth), []);
  const state = !visible ? "paused" : health.state;
  const label = { paused: "paused", waiting: "connecting", ok: "live", refused: "refused", unreachable: "unreachable" }[state];
  return (
    <span class={`live ${state === "ok" ? "on" : state === "paused" || state === "waiting" ? "off" : "bad"}`} data-testid="live-state" data-state={state} title={health.text ? visibleText(health.text) : undefined}>
      {label}
    </span>
  );
}

function App() {
  const route = useRoute();
  const visible = useVisible();
  const [tokenOpen, setTokenOpen] = useState(false);
  const [helpOpen, setHelpOpen] = useState(false);
  const page = route.parts[0] ?? "";

  // A layout effect: the shortcuts work from the first paint (a plain effect runs later).
  useLayoutEffect(() => {
    const onKey = (e: KeyboardEvent) => {
      const target = e.target as HTMLElement;
      if (e.ctrlKey || e.metaKey || e.altKey) return;
      if (document.querySelector('[aria-modal="true"]')) return; // keys belong to the open dialog
      if (["INPUT", "SELECT", "TEXTAREA"].includes(target.tagName)) {
        if (e.key === "Escape") target.blur(); // leave the field; the page's keys work again
        return;
      }
      const match = PAGES.find((p) => p.key === e.key);
      // A key that opens a dialog is consumed: its text would otherwise land in the field the
      // dialog has just focused (a `t` in front of every pasted token).
      if (match) go(match.path);
      else if (e.key === "t") {
        e.preventDefault();
        setTokenOpen(true);
      } else if (e.key === "?") {
        e.preventDefault();
        setHelpOpen(true);
      } else if (e.key === "Escape") {
        // From a job (or a user's queue), back to where such pages are listed.
        const [first, second] = window.location.hash.replace(/^#\/?/, "").split("?")[0].split("/");
        if (first === "jobs" && second) go("jobs");
        else if (first === "users" && second) go("users");
      }
      else if (e.key === "/") {
        const search = document.querySelector<HTMLInputElement>("[data-search]");
        if (search) {
          e.preventDefault();
          search.focus();
        }
      }
    };
    window.addEventListener("keydown", onKey);
    return () => window.removeEventListener("keydown", onKey);
  }, []);

  let content;
  if (page === "jobs" && route.parts[1]) content = <JobDetail jobId={route.parts[1]} live={visible} />;
  else if (page === "jobs") content = <JobsPage params={route.params} live={visible} />;
  else if (page === "users") content = <UserQueuePage userId={route.parts[1] ?? ""} live={visible} />;
  else if (page === "ledger") content = <LedgerPage params={route.params} />;
  else if (page === "replicas") content = <ReplicasPage live={visible} />;
  else if (page === "settings") content = <SettingsPage params={route.params} />;
  else content = <OverviewPage live={visible} />;

  return (
    <NoticeProvider>
      <header class="top">
        <a class="brand" href="#/">
          Acurio <span>queue</span>
        </a>
        <nav>
          {PAGES.map((p) => (
            <a href={`#/${p.path}`} class={page === p.path ? "current" : ""} title={`Press ${p.key}`}>
              {p.label} <kbd>{p.key}</kbd>
            </a>
          ))}
        </nav>
        <LiveMark visible={visible} />
        <button class="token" onClick={() => setTokenOpen(true)} title="Press t">
          {token() ? "Token set" : "Set token"} <kbd>t</kbd>
        </button>
        <button class="help" onClick={() => setHelpOpen(true)} title="Keyboard shortcuts (press ?)" aria-label="Keyboard shortcuts" data-testid="help">
          <kbd>?</kbd>
        </button>
      </header>
      <Notice />
      <main>{content}</main>
      {tokenOpen && <TokenDialog onClose={() => setTokenOpen(false)} />}
      {helpOpen && <HelpDialog onClose={() => setHelpOpen(false)} />}
    </NoticeProvider>
  );
}

render(<App />, document.getElementById("app")!);
