// chronolog dashboard: confirmation of actions, and live updates by polling the watermark.
(function () {
  "use strict";
  // an action form with data-confirm asks first (keyboard and mouse alike)
  document.addEventListener("submit", function (e) {
    var msg = e.target && e.target.getAttribute && e.target.getAttribute("data-confirm");
    if (msg && !window.confirm(msg)) { e.preventDefault(); }
  });
  // never replace a live part while someone types in it
  document.addEventListener("htmx:beforeRequest", function (e) {
    var a = document.activeElement;
    if (a && e.target.contains(a) && /^(INPUT|TEXTAREA|SELECT)$/.test(a.tagName)) {
      e.preventDefault();
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
