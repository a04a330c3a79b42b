import { useEffect, useLayoutEffect, useMemo, useState } from "preact/hooks";

/** The current time, re-rendered every `ms` (countdowns, ages). */
export function useNow(ms = 1000): number {
  const [now, setNow] = useState(Date.now());
  useEffect(() => {
    const timer = setInterval(() => setNow(Date.now()), ms);
    return () => clearInterval(timer);
  }, [ms]);
  return now;
}

/** False while the tab is hidden: live streams close then, and reopen (resync) when it shows. */
export function useVisible(): boolean {
  const [visible, setVisible] = useState(document.visibilityState !== "hidden");
  // As in useRoute: subscribe, then read again, so a change before the subscription counts.
  useLayoutEffect(() => {
    const update = () => setVisible(document.visibilityState !== "hidden");
    document.addEventListener("visibilitychange", update);
    update();
    return () => document.removeEventListener("visibilitychange", update);
  }, []);
  return visible;
}

/** The hash route: `#/jobs?status=queued` is ["jobs"] with params {status: "queued"}. */
export interface Route {
  parts: string[];
  params: URLSearchParams;
}

function parse(hash: string): Route {
  const [path, query] = hash.replace(/^#\/?/, "").split("?", 2);
  return { parts: path.split("/").filter((p) => p !== "").map(decodeURIComponent), params: new URLSearchParams(query ?? "") };
}

export function useRoute(): Route {
  const [hash, setHash] = useState(window.location.hash);
  // Subscribed in a layout effect (a plain effect waits for a paint, which a busy or headless
  // browser may delay), then read once more: a hash that changed between the first render and
  // the subscription fired its hashchange before anyone listened, and would be missed for good.
  useLayoutEffect(() => {
    const update = () => setHash(window.location.hash);
    window.addEventListener("hashchange", update);
    update();
    return () => window.removeEventListener("hashchange", update);
  }, []);
  return useMemo(() => parse(hash), [hash]);
}

export function go(path: string): void {
  window.location.hash = `#/${path}`;
}
