// Live arrival on the audit page: polls "events newer than the newest seen" with the page's own filters.
// New rows slide in only when the reader is at the top of the page; otherwise a pill counts them.
(function () {
  "use strict";
  var table = document.querySelector("[data-audit-events]");
  if (!table || table.dataset.live !== "on") return;
  var rows = table.querySelector("[data-audit-rows]");
  var pill = document.querySelector("[data-audit-pill]");
  var live = document.getElementById("audit-live");
  var newest = table.dataset.newest || "0";
  var waiting = [];
  var INTERVAL = 5000;

  function atTop() {
    return window.scrollY < 40 && !table.contains(document.activeElement);
  }

  function label(n) {
    return n === 1 ? table.dataset.pillOne : table.dataset.pillMany.replace("%(n)s", String(n));
  }

  function show(fragments) {
    fragments.reverse().forEach(function (html) {
      rows.insertAdjacentHTML("afterbegin", html);
    });
    var empty = document.querySelector("[data-audit-empty]");
    if (empty) empty.hidden = true;
  }

  function flush() {
    var count = waiting.length;
    if (!count) return;
    show(waiting);
    waiting = [];
    pill.hidden = true;
    if (live) live.textContent = label(count);
  }

  function poll() {
    var url = table.dataset.newerUrl + (table.dataset.newerUrl.indexOf("?") < 0 ? "?" : "&") + "after=" + newest;
    fetch(url, { credentials: "same-origin", headers: { "X-Requested-With": "fetch" } })
      .then(function (response) {
        if (!response.ok) throw new Error(String(response.status));
        newest = response.headers.get("X-Audit-Newest") || newest;
        var count = parseInt(response.headers.get("X-Audit-Count") || "0", 10);
        return count ? response.text() : "";
      })
      .then(function (html) {
        if (html.trim()) waiting.unshift(html);
        if (!waiting.length) return;
        if (atTop()) {
          flush();
        } else {
          var n = 0;
          waiting.forEach(function (h) { n += (h.match(/data-event-id=/g) || []).length; });
          pill.textContent = label(n);
          pill.hidden = false;
        }
      })
      .catch(function () { /* a missed poll is retried on the next tick */ })
      .finally(function () { window.setTimeout(poll, INTERVAL); });
  }

  if (pill) {
    pill.addEventListener("click", function () {
      flush();
      window.scrollTo({ top: 0, behavior: "smooth" });
    });
  }
  window.setTimeout(poll, INTERVAL);
})();
