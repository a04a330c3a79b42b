import { useEffect, useLayoutEffect, useMemo, useRef, useState } from "preact/hooks";

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

/** What a text field bound to the route holds while it is typed: the route's `value` until the
 * user types, and again whenever the route changes. Bound to the route alone, the field would lose
 * what is typed at every re-render (a clock tick, a live re-read): Preact sets a controlled
 * input's value back to its prop whenever the two differ. */
export function useDraft(value: string): [string, (typed: string) => void] {
  const [draft, setDraft] = useState(value);
  useLayoutEffect(() => setDraft(value), [value]);
  return [draft, setDraft];
}

export function go(path: string): void {
  window.location.hash = `#/${path}`;
}

/** What a read answered for `query` (a page's filter, as a string), read again whenever `query`
 * or `again` changes (a live refresh, an action's done). Every answer lands unless a read issued
 * later already did: a re-read never throws away the read still on its way, so a read slower
 * than the refreshes still shows. An answer for another query than the current one is kept but
 * not returned: while a changed filter is read the page says "Loading…", never the previous
 * filter's rows under the new one. `failed` says the current query's read was refused; `onError`
 * hears each refusal that lands. */
export function useQueryRead<T>(
  query: string,
  read: () => Promise<T>,
  again: unknown,
  onError?: (error: unknown) => void,
): { answered: false } | { answered: true; value: T; failed: false } | { answered: true; failed: true; error: unknown } {
  type Landed = { order: number; query: string } & ({ failed: false; value: T } | { failed: true; error: unknown });
  const issued = useRef(0);
  const newestLanded = useRef(0);
  const [landed, setLanded] = useState<Landed | null>(null);
  useEffect(() => {
    const order = ++issued.current;
    const land = (answer: Landed) => {
      if (order < newestLanded.current) return; // a read issued later has landed already
      newestLanded.current = order;
      setLanded(answer);
      // A refusal is said when it lands, not only if no re-read was issued meanwhile: on a
      // busy fleet one always is, and the refusal would never be said.
      if (answer.failed) onError?.(answer.error);
    };
    read().then(
      (value) => land({ order, query, failed: false, value }),
      (error: unknown) => land({ order, query, failed: true, error }),
    );
  }, [query, again]);
  if (landed === null || landed.query !== query) return { answered: false };
  return landed.failed ? { answered: true, failed: true, error: landed.error } : { answered: true, failed: false, value: landed.value };
}
