// The overview's live figures: every 5 s while the page is visible, fetch the overview
// again (same origin, same cookie) and replace the #live section with the new one. Only
// markup the server rendered (and escaped) is put in; a failed fetch leaves the figures.
const PERIOD_MS = 5000;

async function refresh() {
  const live = document.getElementById("live");
  if (!live || document.visibilityState !== "visible") return;
  try {
    const answer = await fetch(location.href, { credentials: "same-origin", cache: "no-store" });
    if (!answer.ok) return;
    const page = new DOMParser().parseFromString(await answer.text(), "text/html");
    const fresh = page.getElementById("live");
    if (fresh) live.replaceChildren(...fresh.childNodes);
  } catch {
    // The server may be restarting: keep the last figures and try again later.
  }
}

setInterval(refresh, PERIOD_MS);
