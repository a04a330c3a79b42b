import { useEffect, useState } from "preact/hooks";

import { describeError, isCanceled } from "./api.js";

/**
 * Keeps a server stream open while `live` (the tab is visible) and feeds each message to
 * `onMessage`. Hidden tab: the stream is closed. Shown again, or after a failure (retried with
 * a short backoff): it is reopened, and the server starts it with a fresh snapshot (a resync).
 * Returns the latest stream error, or "" while the stream is healthy.
 */
export function useLiveStream<T>(
  open: (signal: AbortSignal) => AsyncIterable<T>,
  onMessage: (message: T, first: boolean) => void,
  deps: unknown[],
  live: boolean,
): string {
  const [problem, setProblem] = useState("");
  useEffect(() => {
    if (!live) return;
    const abort = new AbortController();
    let attempt = 0;
    (async () => {
      while (!abort.signal.aborted) {
        let first = true;
        try {
          for await (const message of open(abort.signal)) {
            onMessage(message, first);
            first = false;
            attempt = 0;
            setProblem("");
          }
        } catch (error) {
          if (abort.signal.aborted || isCanceled(error)) return;
          setProblem(describeError(error));
        }
        attempt += 1;
        await new Promise((resolve) => setTimeout(resolve, Math.min(10_000, 500 * 2 ** attempt)));
      }
    })();
    return () => abort.abort();
    // eslint-disable-next-line react-hooks/exhaustive-deps
  }, [...deps, live]);
  return problem;
}
