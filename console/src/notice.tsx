// One line at the top of the page for the outcome of an action: what went wrong (with the
// ErrorInfo reason, e.g. PERMISSION_DENIED) or what was done.
import { createContext, type ComponentChildren } from "preact";
import { useContext, useEffect, useState } from "preact/hooks";

import { describeError } from "./api.js";
import { UserText } from "./user-text.js";

interface NoticeState {
  kind: "error" | "ok";
  text: string;
}

const NoticeContext = createContext<{ notice: NoticeState | null; set: (n: NoticeState | null) => void }>({
  notice: null,
  set: () => {},
});

export function NoticeProvider({ children }: { children: ComponentChildren }) {
  const [notice, set] = useState<NoticeState | null>(null);
  // A notice belongs to the page it was raised on.
  useEffect(() => {
    const clear = () => set(null);
    window.addEventListener("hashchange", clear);
    return () => window.removeEventListener("hashchange", clear);
  }, []);
  return <NoticeContext.Provider value={{ notice, set }}>{children}</NoticeContext.Provider>;
}

export function useNotice() {
  const { set } = useContext(NoticeContext);
  return {
    error: (error: unknown) => set({ kind: "error", text: describeError(error) }),
    ok: (text: string) => set({ kind: "ok", text }),
    clear: () => set(null),
  };
}

export function Notice() {
  const { notice, set } = useContext(NoticeContext);
  if (notice === null) return null;
  return (
    <div class={`notice ${notice.kind}`} role={notice.kind === "error" ? "alert" : "status"} data-testid="notice">
      <UserText text={notice.text} />
      <button aria-label="Dismiss" onClick={() => set(null)}>
        ×
      </button>
    </div>
  );
}

/** Runs an action, reporting its failure (or its success text) in the notice line. */
export function useAction() {
  const notice = useNotice();
  const [busy, setBusy] = useState(false);
  const run = async (action: () => Promise<string | void>) => {
    setBusy(true);
    try {
      const text = await action();
      if (text) notice.ok(text);
    } catch (error) {
      notice.error(error);
    } finally {
      setBusy(false);
    }
  };
  return { run, busy };
}
