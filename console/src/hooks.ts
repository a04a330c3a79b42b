import { useEffect, useState } from "preact/hooks";

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
  useEffect(() => {
    const update = () => setVisible(document.visibilityState !== "hidden");
    document.addEventListener("visibilitychange", update);
    return () => document.removeEventListener("visibilitychange", update);
  }, []);
  return visible;
}

/** The hash route: `#/jobs?status=queued` is ["jobs"] with params {status: "queued"}. */
export interface Route {
  parts: string[];
  params: URLSearchParams;
}

function parse(): Route {
  const [path, query] = window.location.hash.replace(/^#\/?/, "").split("?", 2);
  return { parts: path.split("/").filter((p) => p !== "").map(decodeURIComponent), params: new URLSearchParams(query ?? "") };
}

export function useRoute(): Route {
  const [route, setRoute] = useState(parse());
  useEffect(() => {
    const update = () => setRoute(parse());
    window.addEventListener("hashchange", update);
    return () => window.removeEventListener("hashchange", update);
  }, []);
  return route;
}

export function go(path: string): void {
  window.location.hash = `#/${path}`;
}
