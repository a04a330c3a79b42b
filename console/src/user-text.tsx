// Text a user, the web backend or the core chose (ids, titles, DOIs, citations, notes, errors,
// actors) is shown isolated and with nothing hidden in it:
// * a <bdi> keeps its direction from reordering the text around it;
// * every character that shows as something other than it is, or as nothing, is written out as
//   its code point, `\u{200B}`, in a style of its own: bidirectional controls (so
//   "10.1234/abc\u202Egpj.exe" reads as it is stored, not as "…exe.jpg"), format characters
//   (zero-width spaces and joiners, the soft hyphen, the byte order mark, tag characters), C0 and
//   C1 controls other than tab and line breaks, the line and paragraph separators and the Hangul
//   fillers. The service refuses all of them in what callers send
//   (queue_service/api/servicers/validation.py, `invisible_character`), but rows stored before
//   that and the core's messages may hold them.
// The pieces are text nodes and elements, never markup: the text is escaped as any other.
import type { ComponentChildren } from "preact";

// \p{Cf} is the browser's current format category, a superset of the service's list (Unicode 14).
const INVISIBLE = /(?![\t\n\r])[\p{Cf}\p{Cc}\u2028\u2029\u115F\u1160\u3164\uFFA0]/gu;

const codePoint = (character: string): string => character.codePointAt(0)!.toString(16).toUpperCase().padStart(4, "0");
/** `\u{200B}`: how an invisible character is written out. */
const escaped = (character: string): string => `\\u{${codePoint(character)}}`;

/** The text with every invisible character written out as `\u{200B}`: for places that take
 * a string only (a title attribute, a line of a notice). */
export function visibleText(text: string): string {
  return text.replace(INVISIBLE, escaped);
}

/** The text as children to render, every invisible character written out as `\u{200B}` in a
 * `<span class="invisible-char">`; the text itself when it holds none. */
export function visible(text: string): ComponentChildren {
  const pieces: ComponentChildren[] = [];
  let last = 0;
  for (const found of text.matchAll(INVISIBLE)) {
    const at = found.index!;
    if (at > last) pieces.push(text.slice(last, at));
    pieces.push(
      <span key={at} class="invisible-char" data-invisible="" title={`U+${codePoint(found[0])}, an invisible character stored in this text`}>
        {escaped(found[0])}
      </span>,
    );
    last = at + found[0].length;
  }
  if (pieces.length === 0) return text;
  if (last < text.length) pieces.push(text.slice(last));
  return pieces;
}

/** User-chosen text, isolated from what surrounds it, its invisible characters written out. */
export function UserText({ text, class: className }: { text: string; class?: string }) {
  return (
    <bdi class={className} data-user-text="">
      {visible(text)}
    </bdi>
  );
}
