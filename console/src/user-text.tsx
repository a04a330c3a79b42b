// Text a user, the web backend or the core chose (ids, titles, DOIs, citations, notes, errors) is
// shown isolated: a <bdi> keeps its direction from reordering the text around it, and a
// bidirectional control character in it (U+202A-U+202E, U+2066-U+2069; the service refuses them
// now, but rows stored before and the core's messages may hold them) is shown by its code point,
// so "10.1234/abc\u202Egpj.exe" reads as it is stored, not as "…exe.jpg".

const BIDI_CONTROLS = /[\u202A-\u202E\u2066-\u2069]/g;

/** The text with every bidirectional control character written out as "[U+202E]". */
export function revealBidiControls(text: string): string {
  return text.replace(BIDI_CONTROLS, (c) => `[U+${c.charCodeAt(0).toString(16).toUpperCase()}]`);
}

/** User-chosen text, isolated from what surrounds it. */
export function UserText({ text, class: className }: { text: string; class?: string }) {
  return (
    <bdi class={className} data-user-text="">
      {revealBidiControls(text)}
    </bdi>
  );
}
