// The EOS console's live refresh and abort confirmation: no framework, no build step.
//
// Every page is server-rendered; its <main id="content"> is also served alone as a
// fragment (?fragment=1). While the "live" box is ticked and the tab is visible, the
// fragment is fetched again every data-refresh-ms and swapped in, so what the page shows
// comes from the same templates (and the same HTML escaping) as the first render.
"use strict";
(function () {
  const body = document.body;
  const content = document.getElementById("content");
  const status = document.getElementById("refresh-status");
  const live = document.getElementById("live");
  const every = Number(body.dataset.refreshMs || 0);
  let busy = false;

  function say(text, failed) {
    if (!status) return;
    status.textContent = text;
    status.classList.toggle("failed", Boolean(failed));
  }

  async function refresh() {
    if (busy || document.hidden || !content || (live && !live.checked)) return;
    busy = true;
    try {
      const url = new URL(window.location.href);
      url.searchParams.delete("notice");
      url.searchParams.delete("error");
      url.searchParams.set("fragment", "1");
      const answer = await fetch(url, { credentials: "same-origin", headers: { "accept": "text/html" } });
      if (answer.redirected || !answer.ok) {
        say("refresh failed: HTTP " + answer.status + (answer.redirected ? " (logged out?)" : ""), true);
        return;
      }
      content.innerHTML = await answer.text();
      say("updated " + new Date().toLocaleTimeString(), false);
    } catch (error) {
      say("refresh failed: coordinator unreachable", true);
    } finally {
      busy = false;
    }
  }

  // Abort buttons ask first; the confirmation text is in the form's data-confirm.
  document.addEventListener("submit", function (event) {
    const form = event.target;
    if (form instanceof HTMLFormElement && form.classList.contains("abort")) {
      if (!window.confirm(form.dataset.confirm || "Abort?")) event.preventDefault();
    }
  });

  if (every > 0 && content) {
    window.setInterval(refresh, every);
    say("refreshing every " + every / 1000 + " s", false);
  }
})();
