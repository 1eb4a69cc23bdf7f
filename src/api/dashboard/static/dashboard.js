// chronolog dashboard: confirmation of actions, and live updates by polling the watermark.
(function () {
  "use strict";
  // an action form with data-confirm asks first (keyboard and mouse alike)
  document.addEventListener("submit", function (e) {
    var msg = e.target && e.target.getAttribute && e.target.getAttribute("data-confirm");
    if (msg && !window.confirm(msg)) { e.preventDefault(); }
  });
  // never replace a live part while the focus is in it (someone types, or tabbed onto a
  // button): it is refreshed once the focus leaves it
  document.addEventListener("htmx:beforeRequest", function (e) {
    var a = document.activeElement;
    if (a && a !== document.body && e.target.contains(a)) {
      e.preventDefault();
      e.target.setAttribute("data-stale", "1");
    }
  });
  document.addEventListener("focusout", function (e) {
    var region = e.target.closest && e.target.closest(".live[data-stale]");
    if (region && !(e.relatedTarget && region.contains(e.relatedTarget)) && window.htmx) {
      region.removeAttribute("data-stale");
      window.htmx.trigger(region, "chronolog:stale");
    }
  });
  var url = document.body.getAttribute("data-watermark-url");
  if (!url) { return; }
  // the watermark the page was read at: any change after it refreshes the live parts
  var last = document.body.getAttribute("data-watermark") || null;
  var status = document.getElementById("live-status");
  function poll() {
    fetch(url, {credentials: "same-origin", headers: {"Accept": "application/json"}})
      .then(function (r) { return r.ok ? r.json() : null; })
      .then(function (body) {
        if (!body) { return; }
        if (last !== null && body.watermark !== last && window.htmx) {
          window.htmx.trigger(document.body, "chronolog:changed");
        }
        last = body.watermark;
        if (status) { status.textContent = "live · projected to " + (body.time || "—"); }
      })
      .catch(function () { if (status) { status.textContent = "live updates paused"; } })
      .finally(function () { window.setTimeout(poll, 2000); });
  }
  poll();
})();
