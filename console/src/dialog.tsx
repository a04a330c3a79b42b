// A modal dialog: focus moves into it when it opens (the element marked data-autofocus, else the
// first control), Tab and Shift-Tab stay inside, Escape and a click on the backdrop close it, and
// focus returns to where it was (the button that opened it) when it closes.
import type { ComponentChildren, RefObject } from "preact";
import { useLayoutEffect, useRef, useState } from "preact/hooks";

const FOCUSABLE = 'button:not([disabled]), input:not([disabled]), select:not([disabled]), textarea:not([disabled]), a[href], [tabindex]:not([tabindex="-1"])';

export function Modal({
  label,
  role = "dialog",
  onClose,
  returnTo,
  children,
}: {
  label: string;
  role?: "dialog" | "alertdialog";
  onClose: () => void;
  /** Where focus goes on close when it was nowhere at open (the opener, disabled while it worked). */
  returnTo?: RefObject<HTMLElement>;
  children: ComponentChildren;
}) {
  const box = useRef<HTMLDivElement>(null);
  const close = useRef(onClose);
  close.current = onClose;
  useLayoutEffect(() => {
    const focused = document.activeElement as HTMLElement | null;
    const before = focused && focused !== document.body ? focused : (returnTo?.current ?? null);
    const el = box.current!;
    (el.querySelector<HTMLElement>("[data-autofocus]") ?? el.querySelector<HTMLElement>(FOCUSABLE) ?? el).focus();
    const onKey = (e: KeyboardEvent) => {
      if (e.key === "Escape") {
        e.preventDefault();
        e.stopPropagation();
        close.current();
      } else if (e.key === "Tab") {
        const items = [...el.querySelectorAll<HTMLElement>(FOCUSABLE)];
        if (items.length === 0) return e.preventDefault();
        const first = items[0];
        const last = items[items.length - 1];
        const inside = el.contains(document.activeElement);
        if (e.shiftKey && (!inside || document.activeElement === first)) {
          e.preventDefault();
          last.focus();
        } else if (!e.shiftKey && (!inside || document.activeElement === last)) {
          e.preventDefault();
          first.focus();
        }
      }
    };
    // Captured on the document: the page's own shortcuts (1-3, t, /) never see a key meant here.
    document.addEventListener("keydown", onKey, true);
    return () => {
      document.removeEventListener("keydown", onKey, true);
      if (before && document.contains(before)) before.focus();
    };
  }, []);
  return (
    <div class="dialog-backdrop" role="presentation" onClick={() => close.current()}>
      <div class="dialog" role={role} aria-modal="true" aria-label={label} tabIndex={-1} ref={box} onClick={(e) => e.stopPropagation()}>
        {children}
      </div>
    </div>
  );
}

/** A button that opens a confirmation; `onConfirm` runs only from the dialog's own button. */
export function Confirmed({
  label,
  title,
  confirmLabel,
  testId,
  danger,
  disabled,
  onConfirm,
  children,
}: {
  label: string;
  title: string;
  confirmLabel: string;
  testId: string;
  danger?: boolean;
  disabled?: boolean;
  onConfirm: () => Promise<void>;
  children: ComponentChildren;
}) {
  const [open, setOpen] = useState(false);
  const opener = useRef<HTMLButtonElement>(null);
  return (
    <>
      <button type="button" class={danger ? "danger" : ""} disabled={disabled} onClick={() => setOpen(true)} data-testid={testId} ref={opener}>
        {label}
      </button>
      {open && (
        <Modal role="alertdialog" label={title} onClose={() => setOpen(false)} returnTo={opener}>
          <form
            onSubmit={(e) => {
              e.preventDefault();
              setOpen(false);
              void onConfirm();
            }}
          >
            <h2>{title}</h2>
            {children}
            <div class="actions">
              <button type="button" onClick={() => setOpen(false)} data-autofocus>
                Keep it <kbd>Esc</kbd>
              </button>
              <button type="submit" class={danger ? "danger" : "primary"} data-testid={`${testId}-confirm`}>
                {confirmLabel}
              </button>
            </div>
          </form>
        </Modal>
      )}
    </>
  );
}

