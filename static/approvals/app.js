/* Elicit Hub dashboard: live queue, countdowns, client-side checks, keyboard shortcuts.
   No build step. Pages work without this script; it adds live updates and comfort. */
(function () {
  "use strict";

  const T = JSON.parse(document.getElementById("ui-strings")?.textContent || "{}");
  const fmt = (text, values) => String(text || "").replace(/%\((\w+)\)s/g, (_, key) => values[key] ?? "");
  const $ = (sel, root) => (root || document).querySelector(sel);
  const $$ = (sel, root) => Array.from((root || document).querySelectorAll(sel));
  const lang = document.documentElement.lang || navigator.language;
  const locale = navigator.language || lang;

  // The browser's time zone, for the server to show and read date-times in (see views._reviewer_tz).
  try {
    const zone = Intl.DateTimeFormat().resolvedOptions().timeZone;
    if (zone && /^[A-Za-z0-9_+\-/]+$/.test(zone)) document.cookie = `tz=${zone}; path=/; SameSite=Lax; max-age=31536000`;
  } catch (e) { /* no Intl: the server's zone stays */ }

  function announce(text) {
    const region = $("#announcer");
    if (!region) return;
    region.textContent = "";
    window.setTimeout(() => { region.textContent = text; }, 50);
  }

  // --- times: local format, countdowns, waiting times ------------------------------------------

  function duration(ms) {
    const s = Math.max(0, Math.round(ms / 1000));
    const h = Math.floor(s / 3600), m = Math.floor((s % 3600) / 60), sec = s % 60;
    const nf = new Intl.NumberFormat(locale, { minimumIntegerDigits: 2 });
    if (h) return `${new Intl.NumberFormat(locale).format(h)}:${nf.format(m)}:${nf.format(sec)}`;
    return `${new Intl.NumberFormat(locale).format(m)}:${nf.format(sec)}`;
  }

  function localiseTimes(root) {
    const df = new Intl.DateTimeFormat(locale, { dateStyle: "medium", timeStyle: "medium" });
    $$("time[data-local-time]", root).forEach((el) => {
      const when = new Date(el.getAttribute("datetime"));
      if (!isNaN(when)) { el.textContent = df.format(when); el.title = el.getAttribute("datetime"); }
    });
  }

  function tick() {
    const now = Date.now();
    if (status && status.dataset.state === "down" && live.lastMessage) {
      // Beside the announced state, not in it: a live region read out again every second would drown the page.
      $("[data-live-ago]", status).textContent = fmt(T.updated, { ago: duration(now - live.lastMessage) });
    }
    $$("[data-countdown]").forEach((el) => {
      const left = new Date(el.dataset.countdown).getTime() - now;
      el.textContent = left > 0 ? fmt(T.left, { time: duration(left) }) : T.expired;
      el.classList.toggle("is-urgent", left > 0 && left < 5 * 60 * 1000);
    });
    announceDeadline(now);
    $$("[data-since]").forEach((el) => {
      el.textContent = fmt(T.waiting, { time: duration(now - new Date(el.dataset.since).getTime()) });
    });
  }

  // An open request's own deadline is announced as it comes close (5 minutes, then 1), and once it passes:
  // politely, once per threshold, never every second. Thresholds already behind when the page opened are
  // announced once together, as the nearest.
  const DEADLINE_STEPS = [5 * 60 * 1000, 60 * 1000, 0];
  const deadlineHeard = new Set();

  function announceDeadline(now) {
    const el = $("[data-review][data-open-request] .status-line [data-countdown]");
    if (!el) return;
    const left = new Date(el.dataset.countdown).getTime() - now;
    const crossed = DEADLINE_STEPS.filter((step) => left <= step && !deadlineHeard.has(step));
    if (!crossed.length) return;
    crossed.forEach((step) => deadlineHeard.add(step));
    announce(left > 0 ? fmt(T.deadlineClose, { time: duration(left) }) : T.deadlinePassed);
  }

  // --- live connection ------------------------------------------------------------------------------

  const live = { socket: null, retry: 0, lastMessage: 0, pingTimer: null, up: false };
  const SIGNED_OUT = 4401; // consumers.SIGNED_OUT
  // The hub answers every ping (sent every PING_EVERY). A connection that died without closing (a laptop that
  // slept, a network that went) can keep its socket open for many minutes: one whose ping went unanswered
  // until the next is due, or that did not open within SILENT_FOR, is given up and made again, so the page
  // never says "Live" over a dead line. (A hidden tab's timers may run once a minute: only an unanswered
  // ping counts, never the time between pings.)
  const PING_EVERY = 10000;
  const SILENT_FOR = 25000;
  const status = $("#live-status");
  const banner = $("#live-banner");

  function setLive(up) {
    live.up = up;
    document.body.classList.toggle("is-offline", !up);
    if (status) {
      status.dataset.state = up ? "live" : "down";
      const state = $("[data-live-state]", status);
      const text = up ? T.live : T.reconnecting;
      if (state.textContent !== text) state.textContent = text; // each failed retry would announce it again
      if (up) $("[data-live-ago]", status).textContent = "";
    }
    if (banner) banner.hidden = up;
  }

  function connect() {
    const path = document.body.dataset.liveUrl;
    if (!path || !("WebSocket" in window)) return;
    const url = (location.protocol === "https:" ? "wss://" : "ws://") + location.host + path;
    const socket = new WebSocket(url);
    live.socket = socket;
    const made = Date.now();
    let heard = 0, asked = 0; // when it last said anything; when its ping still unanswered went out
    window.clearInterval(live.pingTimer);
    live.pingTimer = window.setInterval(() => {
      const now = Date.now();
      if (socket.readyState !== WebSocket.OPEN) {
        if (now - made > SILENT_FOR) lost(socket);
      } else if (asked && heard < asked) {
        lost(socket);
      } else {
        asked = now;
        send({ type: "ping" });
      }
    }, PING_EVERY);
    socket.addEventListener("message", (e) => {
      if (live.socket !== socket) return;
      heard = live.lastMessage = Date.now();
      let message;
      try { message = JSON.parse(e.data); } catch (err) { return; }
      handle(message);
    });
    socket.addEventListener("close", (e) => {
      if (live.socket !== socket) return;
      // Signed out (elsewhere, expired, deactivated): what the page shows is no longer theirs to see. The
      // reload leads to the sign-in page; the hub closes with this code only once the session is gone.
      if (e.code === SIGNED_OUT) { live.socket = null; window.clearInterval(live.pingTimer); location.reload(); return; }
      lost(socket);
    });
  }

  // The socket is no longer this page's (closed, or silent too long): say so, and try again, later each time.
  function lost(socket) {
    if (live.socket !== socket) return;
    live.socket = null; // its close, whenever the browser gets to it, is no longer heard
    window.clearInterval(live.pingTimer);
    if (socket.readyState !== WebSocket.CLOSED) socket.close();
    setLive(false);
    // A hub that restarts drops every page's socket at the same moment: each page waits a random share of its
    // step, so they do not all come back, and all read their lists again, at the same instant.
    const step = Math.min(10000, 500 * 2 ** live.retry++);
    window.setTimeout(connect, step / 2 + (Math.random() * step) / 2);
  }

  function send(message) {
    if (live.socket && live.socket.readyState === WebSocket.OPEN) live.socket.send(JSON.stringify(message));
  }

  function handle(message) {
    switch (message.type) {
      case "hello":
        live.retry = 0;
        setLive(true);
        const callPage = $("[data-call-page]");
        if (callPage) send({ type: "watch_call", call: callPage.dataset.callPage });
        const watched = $("[data-review][data-watch-request]");
        if (watched) send({ type: "watch_call", call: watched.dataset.call });
        resync(); // whatever happened while the page had no socket
        break;
      case "resync": resync(); break;
      case "card": onCard(message); break;
      case "presence":
        $$(`[data-presence-for="${message.input_request}"]`).forEach((el) => { el.innerHTML = message.html; });
        break;
      case "call": onCall(message); break;
      case "watching":
        // The hub now tells this page of the call's changes: the page says so (data-watching).
        $$(`[data-call-page="${CSS.escape(String(message.call))}"], [data-review][data-call="${CSS.escape(String(message.call))}"]`)
          .forEach((el) => el.setAttribute("data-watching", ""));
        break;
      case "refused": {
        // The call page's call is no longer this user's to see (removed from its team): the page's own
        // answer (not found) replaces what it showed.
        const callPage = $("[data-call-page]");
        if (callPage && callPage.dataset.callPage === message.call) location.reload();
        const watched = $("[data-review][data-watch-request]");
        if (watched && watched.dataset.call === message.call) location.reload();
        break;
      }
      default: break;
    }
  }

  function fetchFrom(url, read) {
    return fetch(url, { credentials: "same-origin", headers: { "X-Requested-With": "fetch" } })
      // A fragment's address never redirects: one that did was answered by the sign-in page (the session
      // ended), whose markup is no fragment of this page. The socket's close (SIGNED_OUT) takes the page there.
      .then((r) => (r.ok && !r.redirected ? read(r) : Promise.reject(r.redirected ? 0 : r.status)));
  }
  const fetchHtml = (url) => fetchFrom(url, (r) => r.text());
  // A resync's read of the page's own request or call that is not found: the user may no longer see it
  // (removed from its team). The page's own answer replaces what it showed.
  const goneUnlessFound = (status) => { if (status === 404) location.reload(); };

  function resync() {
    const queue = $("[data-queue]");
    if (queue) readQueue(queue);
    const review = $("[data-review]");
    if (review && review.hasAttribute("data-open-request")) {
      fetchHtml(review.dataset.stateUrl).then((html) => {
        if (html.trim()) lockReview(html);
      }).catch(goneUnlessFound);
    }
    if (review && review.hasAttribute("data-watch-request")) readWatchedState(review);
    const callPage = $("[data-call-page]");
    if (callPage) readCallBody(callPage).catch(goneUnlessFound);
  }

  // The call page's body, and as of when it was shown (performance.now()): a read answers as of when it was
  // asked, so one answered after a notice heard, or after a read asked later, would undo them.
  let callShownAt = -1;
  function showCallBody(callPage, html, at) {
    if (at < callShownAt) return;
    callShownAt = at;
    callPage.innerHTML = html;
    localiseTimes(callPage);
  }
  function readCallBody(callPage) {
    const asked = performance.now();
    return fetchHtml(callPage.dataset.bodyUrl).then((html) => showCallBody(callPage, html, asked));
  }

  // --- a resync merges the list as the server draws it now into the one shown -------------------------

  function readQueue(queue) {
    const asked = performance.now();
    fetchHtml(queue.dataset.listUrl + location.search).then((html) => {
      const wrapper = document.createElement("div");
      wrapper.innerHTML = html;
      mergeQueue(queue, wrapper.firstElementChild, asked);
    }).catch(() => {});
  }

  // What the page last learnt of each round, and when (performance.now()): a card notice, a list merged (as of
  // when it was asked for), a card read decided. A list answers as of when it was asked for: a round the page
  // heard of since (a notice that crossed the list on a slow line, or a later list that came back first)
  // keeps what the page knows of it.
  const heard = new Map();
  const newerThan = (round, asked) => (heard.get(String(round))?.at ?? -1) > asked;

  // Swapping the whole list would drop a card decided meanwhile without its greyed stage, take the focus and
  // the selection away and jump what is in view. Instead: a card still waiting is redrawn in place; one the
  // list no longer holds is read (`settleVanished`): decided, it stays greyed with who decided, then folds;
  // new cards come in at their place (the list's order: soonest deadline first); a card whose deadline moved
  // goes to its new place unless it holds the focus or the pointer; focus, selection, open folds and the
  // view stay.
  function mergeQueue(queue, fresh, asked) {
    const list = $("[data-queue-list]", queue);
    if (!list || !fresh?.matches("[data-queue-list]")) return;
    const selected = $(".request-row.is-selected", list)?.dataset.request;
    const focused = focusKey(list);
    const shown = new Map($$(":scope > .card", list).map((card) => [card.dataset.round, card]));
    const added = [];
    keepInView(list, () => {
      $$(":scope > :not(.card)", list).forEach((el) => el.remove()); // the empty and "more" notes, as they were
      list.dataset.pendingTotal = fresh.dataset.pendingTotal || "0";
      if (fresh.dataset.capped) list.dataset.capped = fresh.dataset.capped;
      else delete list.dataset.capped;
      // From the last back: a card goes just before the next card of the list, so it lands after every card
      // the list puts before it, a card decided meanwhile included.
      let next = null;
      $$(":scope > .card", fresh).reverse().forEach((card) => {
        const round = card.dataset.round;
        const old = shown.get(round);
        if (newerThan(round, asked)) {
          // Known better than the list: kept as shown; or, decided since, not brought back.
          shown.delete(round);
          if (old) next = old;
          else if (heard.get(round).pending) {
            localiseTimes(card);
            list.insertBefore(card, next);
            added.push(card);
            next = card;
          }
          return;
        }
        heard.set(round, { at: asked, pending: true });
        localiseTimes(card);
        if (old) {
          shown.delete(round);
          keepOpenFolds(old, card);
          if (held(old) || old.dataset.order === card.dataset.order) old.replaceWith(card);
          else { list.insertBefore(card, next); old.remove(); } // its deadline moved: to its new place
        } else {
          card.classList.add("is-new");
          list.insertBefore(card, next);
          added.push(card);
        }
        next = card;
      });
      const notes = $$(":scope > :not(.card)", fresh);
      const empty = !$(":scope > .card", list);
      notes.forEach((note) => { if (empty || !note.matches("[data-empty]")) list.appendChild(note); });
    });
    if (selected) select($(`[data-request="${CSS.escape(selected)}"]`, list), false);
    restoreFocus(list, focused);
    settleVanished(list, [...shown.values()].filter((card) => !newerThan(card.dataset.round, asked)));
    added.reverse().forEach((card) => showNewPill(card));
    if (added.length === 1) {
      const [card] = added;
      announce(fmt(T.newRequest, { server: $(".server-name", card)?.textContent || "", tool: $(".tool", card)?.textContent || "" }));
    } else if (added.length) {
      announce(fmt(T.newCount, { count: added.length }));
    }
    tick();
    updateCount();
  }

  // The queue's order (selectors.RoundCard.order): soonest deadline first, a round without one last.
  const sortsBefore = (card, other) => (card.dataset.order || "") < (other.dataset.order || "");

  // What a card arriving live goes just before: the first card of the list that sorts after it (else the
  // list's closing note, or its end).
  function placeOf(list, card) {
    return $$(":scope > .card", list).find((other) => other !== card && sortsBefore(card, other))
      || $(":scope > [data-queue-more]", list);
  }

  // A card shown out of its place (its deadline moved): the one before it sorts after it, or the next before.
  function misplaced(card) {
    const prev = card.previousElementSibling, next = card.nextElementSibling;
    return (prev?.matches(".card") && sortsBefore(card, prev)) || (next?.matches(".card") && sortsBefore(next, card));
  }

  // The card holds the keyboard focus or is under the pointer: it is not moved.
  function held(card) {
    return card.contains(document.activeElement) || card.matches(":hover");
  }

  // The open "show all" folds of a card stay open when it is redrawn.
  function keepOpenFolds(old, card) {
    const folds = $$(".show-all", card);
    $$(".show-all", old).forEach((fold, i) => { if (fold.open && folds[i]) folds[i].open = true; });
  }

  // A change to the list that leaves what the reviewer looks at where it was on the screen: the card holding
  // the focus or under the pointer, else the first card in view, keeps its place (the page scrolls by what
  // moved above it). Only a reviewer at the top of the page and idle sees rows slide in above.
  function keepInView(list, change, leaving = null) {
    list.style.overflowAnchor = "none"; // the browser's own anchoring would pick a card about to be redrawn
    const active = document.activeElement;
    const hovered = $$(":hover", list).pop();
    const busy = (active && active !== list && list.contains(active)) || !!hovered;
    const around = (el) => {
      const card = el?.closest?.("[data-round]");
      return card && card !== leaving ? card : null;
    };
    const anchor = around(list.contains(active) ? active : null) || around(hovered)
      || $$(":scope > .card", list).find((card) => card !== leaving && card.getBoundingClientRect().bottom > 0);
    const round = anchor?.dataset.round;
    const before = anchor?.getBoundingClientRect().top;
    change();
    if (!round || (window.scrollY === 0 && !busy)) return;
    const after = $(`:scope > [data-round="${CSS.escape(round)}"]`, list);
    const moved = after ? after.getBoundingClientRect().top - before : 0;
    if (moved) window.scrollBy(0, moved);
  }

  // At most this many requests of cards gone from the list are read at a resync (one request each): after a
  // long time offline the rest leave at once, without their greyed stage.
  const SETTLE_MAX = 20;

  // Cards the list no longer holds: each pending request is read. Decided (or expired, or cancelled), its row
  // says so and the card, greyed, folds as a card notice would fold it; not found (no longer the reviewer's
  // to see) or still waiting for someone else, the card leaves the page.
  function settleVanished(list, gone) {
    let budget = SETTLE_MAX;
    gone.filter((card) => Number(card.dataset.pending)).forEach((card) => {
      const pending = $$("[data-pending-request]", card);
      if (budget < pending.length || pending.some((row) => !row.dataset.stateUrl)) { leave(list, card); return; }
      budget -= pending.length;
      Promise.all(pending.map((row) => fetchFrom(row.dataset.stateUrl, (r) => r.text()).then(
        (html) => ({ row, html }),
        (status) => ({ row, html: status === 404 ? null : undefined }),
      ))).then((states) => {
        if (!card.isConnected || !Number(card.dataset.pending)) return; // redrawn or decided meanwhile
        if (states.some((s) => s.html === undefined)) return; // unread (offline): the next resync reads it
        if (states.some((s) => s.html === null || !s.html.trim())) { leave(list, card); return; }
        keepInView(list, () => states.forEach(({ row, html }) => decideRow(row, html)));
        heard.set(card.dataset.round, { at: performance.now(), pending: false });
        card.classList.add("is-done");
        card.dataset.pending = "0";
        announce(T.decided);
        updateCount();
        fold(card);
      });
    });
  }

  function decideRow(row, html) {
    row.classList.add("is-decided");
    row.removeAttribute("data-pending-request");
    $("[data-decided]", row)?.remove();
    $$("[data-presence-for]", row).forEach((el) => { el.innerHTML = ""; });
    row.insertAdjacentHTML("beforeend", html);
    localiseTimes(row);
  }

  function leave(list, card) {
    if (!card.isConnected) return;
    keepInView(list, () => card.remove(), card);
    updateCount();
    ensureEmpty();
  }

  const QUIET_EVENTS = ["round.opened", "call.progress", "round.extended"];

  // The request's deadline moved (a reviewer extended it): the page's status line is drawn again, nothing else.
  // Two extensions in quick succession ask twice; the answers may come back in either order, and the one asked
  // first, drawn last, would show the earlier deadline: a page keeps the line of the latest read it asked for.
  let statusAskedAt = -1;
  function refreshStatusLine(review) {
    const asked = performance.now();
    statusAskedAt = asked;
    fetchHtml(review.dataset.pageUrl).then((html) => {
      if (asked !== statusAskedAt) return;
      const fresh = new DOMParser().parseFromString(html, "text/html").querySelector("[data-review] .status-line");
      const line = $(".status-line", review);
      if (fresh && line) { line.replaceWith(fresh); localiseTimes(fresh); }
    }).catch(() => {});
  }

  function matchesFilters(card) {
    const queue = $("[data-queue]");
    const { filterServer, filterTool, filterMode, filterRisk } = queue.dataset;
    if (filterServer && card.dataset.server !== filterServer) return false;
    if (filterTool && card.dataset.tool !== filterTool) return false;
    if (filterMode && !card.dataset.modes.split(" ").includes(filterMode)) return false;
    if (filterRisk) {
      const risks = (card.dataset.risks || "").split(" ");
      if (!risks.includes("high") && !(filterRisk === "medium" && risks.includes("medium"))) return false;
    }
    return true;
  }

  function onCard(message) {
    const queue = $("[data-queue]");
    if (queue) {
      const wrapper = document.createElement("div");
      wrapper.innerHTML = message.html;
      const card = wrapper.firstElementChild;
      const existing = $(`#round-${message.round}`, queue);
      heard.set(String(message.round), { at: performance.now(), pending: !!message.pending });
      localiseTimes(card);
      if (existing) {
        const selected = $(".request-row.is-selected", existing)?.dataset.request;
        const focused = focusKey(existing);
        const stay = held(existing);
        keepOpenFolds(existing, card);
        existing.replaceWith(card);
        if (!stay && message.pending && misplaced(card)) {
          // Its deadline moved (extended): it goes to its place, the view held where it was.
          const list = card.parentElement;
          keepInView(list, () => list.insertBefore(card, placeOf(list, card)), card);
        }
        if (selected) select($(`[data-request="${CSS.escape(selected)}"]`, card), false);
        restoreFocus(card, focused);
        if (!message.pending) fold(card);
        // A progress report or a deadline extended redraws the card quietly; only a decision is announced.
        if (!QUIET_EVENTS.includes(message.event)) announce(T.decided);
      } else if (message.pending && matchesFilters(card)) {
        const list = $("[data-queue-list]", queue);
        const server = $(".server-name", card)?.textContent || "";
        const tool = $(".tool", card)?.textContent || "";
        const last = $$(":scope > .card", list).pop();
        if (capped() && (!last || !sortsBefore(card, last))) {
          // The page shows only the rounds with the soonest deadlines: a later one waits behind them, counted.
          if (message.event === "round.opened") announce(fmt(T.newBehind, { server, tool }));
        } else {
          // At its place in the list; what the reviewer looks at stays where it is on the screen.
          $("[data-empty]", list)?.remove();
          card.classList.add("is-new");
          keepInView(list, () => list.insertBefore(card, placeOf(list, card)));
          announce(fmt(T.newRequest, { server, tool }));
          showNewPill(card);
        }
      }
      if (capped()) countSoon(); // rounds not shown came or went: the server counts them
      updateCount();
    }
    const review = $("[data-review]");
    if (review && message.decided && message.decided[review.dataset.request]) {
      lockReview(message.decided[review.dataset.request]);
    } else if (review && message.event === "round.extended" && (message.input_requests || []).includes(review.dataset.request)) {
      refreshStatusLine(review);
    }
    const callPage = $("[data-call-page]");
    if (callPage && callPage.dataset.callPage === message.call) readCallBody(callPage).catch(() => {});
  }

  // A card or the list redrawn under the keyboard focus keeps it: on the same request's link, the same
  // address, or the same fold; else on the redrawn part itself (never thrown back to the page's top).
  function focusKey(root) {
    const active = document.activeElement;
    if (!active || active === document.body || !root.contains(active)) return null;
    const row = active.closest("[data-request]");
    if (row && active.matches("[data-open]")) return `[data-request="${CSS.escape(row.dataset.request)}"] [data-open]`;
    if (active.matches(".show-all > summary")) {
      const card = active.closest("[data-round]");
      return card ? `[data-round="${CSS.escape(card.dataset.round)}"] .show-all > summary` : null;
    }
    const href = active.getAttribute("href");
    return href ? `a[href="${CSS.escape(href)}"]` : "";
  }

  function restoreFocus(root, key) {
    if (key === null || root.contains(document.activeElement)) return;
    let target = key ? $(key, root) : null;
    if (!target) {
      target = root;
      if (!target.hasAttribute("tabindex")) target.tabIndex = -1;
    }
    target.focus({ preventScroll: true });
  }

  function showNewPill(card) {
    const pill = $("[data-new-pill]");
    if (!pill) return;
    const rect = card.getBoundingClientRect();
    if (rect.bottom > 0 && rect.top < window.innerHeight) return; // visible already
    const count = (Number(pill.dataset.count) || 0) + 1;
    pill.dataset.count = count;
    pill.textContent = fmt(T.newCount, { count });
    pill.hidden = false;
    pill.onclick = () => { pill.hidden = true; pill.dataset.count = 0; card.scrollIntoView({ behavior: "smooth" }); };
  }

  // Whether taking the card away would move `el`: it is in the card, or in the list after it.
  function movedBy(card, el) {
    if (!el || el === document.body) return false;
    const list = card.parentElement;
    return card.contains(el) || !!(list?.contains(el) && card.compareDocumentPosition(el) & Node.DOCUMENT_POSITION_FOLLOWING);
  }

  function fold(card) {
    // Decided elsewhere: stays greyed with who decided, then folds away; never from under the pointer or the
    // keyboard focus (the rows below would move up under them): it waits until they are elsewhere.
    window.setTimeout(function attempt() {
      if (!card.isConnected || Number(card.dataset.pending)) return; // redrawn meanwhile: that card folds
      const hovered = $$(":hover", card.parentElement).pop();
      if (movedBy(card, document.activeElement) || movedBy(card, hovered)) { window.setTimeout(attempt, 1000); return; }
      card.classList.add("is-folding");
      window.setTimeout(() => {
        card.remove();
        updateCount();
        const list = capped();
        // Half of the rounds shown are answered: the next ones due come in at their place.
        if (list && $$(".card", list).length < Number(list.dataset.capped) / 2) resync();
        else ensureEmpty();
      }, 450);
    }, 4000);
  }

  // The list emptied: the server's note says why (nothing waits, or nothing matches the filters). Merged, not
  // swapped in: a card that came in while the list was read stays.
  function ensureEmpty() {
    const list = $("[data-queue-list]");
    if (list && !$(".card", list) && !$("[data-empty]", list)) readQueue($("[data-queue]"));
  }

  // --- a queue page showing only the rounds that waited longest (data-capped: at most that many) -----

  function capped() {
    return $("[data-queue-list][data-capped]");
  }

  function shownPending() {
    return $$("[data-pending-request]", $("[data-queue]")).length;
  }

  let countTimer = null;
  function countSoon() {
    // The count of everything waiting, asked of the server at most once a second (never the whole list).
    if (countTimer) return;
    countTimer = window.setTimeout(() => {
      countTimer = null;
      const queue = $("[data-queue]");
      fetchFrom(queue.dataset.countUrl + location.search, (r) => r.json())
        .then(({ pending }) => {
          const list = capped();
          if (!list) return;
          list.dataset.pendingTotal = String(pending);
          if (pending <= shownPending()) { // nothing waits behind the rounds shown any more
            delete list.dataset.capped;
            $("[data-queue-more]", list)?.remove();
          }
          updateCount();
        }).catch(() => {});
    }, 1000);
  }

  function updateCount() {
    const queue = $("[data-queue]");
    if (!queue) return;
    const list = capped();
    const count = list ? Math.max(Number(list.dataset.pendingTotal) || 0, shownPending()) : shownPending();
    const badge = $("[data-pending-count]");
    if (badge) badge.textContent = String(count);
    document.title = (count ? `(${count}) ` : "") + queue.dataset.title + " · Elicit Hub";
  }

  function onCall(message) {
    const callPage = $("[data-call-page]");
    if (callPage && callPage.dataset.callPage === message.call && message.html) {
      showCallBody(callPage, message.html, performance.now());
    }
    const watched = $("[data-review][data-watch-request]");
    if (watched && watched.dataset.call === message.call) readWatchedState(watched);
  }

  // A request shown pending to someone who may see it but not answer it (a viewer): their socket hears no
  // queue of its team, so the page follows its call (watch_call) and reads the request's state when the call
  // changes, instead of saying "Pending" for good once it was answered or expired.
  function readWatchedState(review) {
    fetchHtml(review.dataset.stateUrl).then((html) => {
      if (!html.trim() || !review.hasAttribute("data-watch-request")) return;
      review.removeAttribute("data-watch-request");
      const slot = $("[data-decided-slot]", review);
      slot.innerHTML = html;
      localiseTimes(slot);
      $$(".status-line", review).forEach((el) => { el.hidden = true; });
      $$("[data-presence-for]", review).forEach((el) => { el.innerHTML = ""; });
      announce(slot.textContent.trim());
    }).catch(goneUnlessFound);
  }

  // --- the request page --------------------------------------------------------------------------

  function lockReview(decidedHtml) {
    const review = $("[data-review]");
    if (!review || !review.hasAttribute("data-open-request")) return;
    review.removeAttribute("data-open-request");
    review.classList.add("is-locked");
    const slot = $("[data-decided-slot]", review);
    slot.innerHTML = decidedHtml;
    localiseTimes(slot);
    $$("[data-decision] button, [data-second-look] button", review).forEach((el) => { el.disabled = true; });
    // A decline reason being written stays in view, to copy; an unopened one cannot be opened any more.
    const decline = $("[data-decline]", review);
    const reason = $("#decline-reason", review);
    if (decline && !(decline.open && reason?.value.trim())) { decline.open = false; decline.inert = true; }
    keepForCopying(review);
    $$("[data-presence-for]", review).forEach((el) => { el.innerHTML = ""; });
    $$(".status-line", review).forEach((el) => { el.hidden = true; });
    const note = document.createElement("p");
    note.className = "notice";
    note.setAttribute("role", "status");
    note.textContent = T.locked;
    slot.appendChild(note);
    announce(slot.textContent.trim());
    $("[data-presence-beat]")?.remove();
    sendPresence(true);
  }

  // What was typed stays on the locked page to be copied: text is made read-only (a disabled field's text
  // cannot be selected), the other inputs disabled. Nothing can be sent from it any more.
  function keepForCopying(review) {
    $$(":is([data-form-body], [data-decision]) :is(input, select, textarea)", review)
      .forEach((el) => {
        if (el.matches("textarea, input:not([type=checkbox]):not([type=radio])")) el.readOnly = true;
        else el.disabled = true;
      });
  }

  // Approving never happens within a second of the request appearing or changing. Once the buttons take
  // clicks again the review says so (data-armed), for whatever waits on it.
  function armApprove() {
    const review = $("[data-review]");
    if (!review || !review.hasAttribute("data-open-request")) return;
    const buttons = $$("[data-approve]").filter((button) => !button.disabled);
    buttons.forEach((button) => { button.disabled = true; });
    window.setTimeout(() => {
      if (!review.hasAttribute("data-open-request")) return;
      buttons.forEach((button) => { button.disabled = false; });
      review.setAttribute("data-armed", "");
    }, 1000);
  }

  function sendingState(form) {
    const decision = $("[data-decision]");
    // After the browser has read the form: disabling first would drop the submitter from the data.
    window.setTimeout(() => {
      if (!decision) return;
      decision.classList.add("is-sending");
      $$("button", decision).forEach((b) => { b.disabled = true; });
      const approve = $("[data-approve]", decision);
      if (approve && form.id === "answer-form") approve.textContent = T.sending;
    }, 0);
  }

  function presenceUrl() {
    const review = $("[data-review]");
    return review ? review.dataset.presenceUrl : null;
  }

  // This page's own name for its presence (services.presence): the same reviewer on the same request in two
  // tabs has two entries, and closing one leaves them looking through the other.
  const PRESENCE_TAB = Array.from(crypto.getRandomValues(new Uint8Array(12)), (b) => b.toString(16).padStart(2, "0")).join("");

  function sendPresence(leave) {
    const url = presenceUrl();
    const token = $("input[name=csrfmiddlewaretoken]")?.value;
    if (!url || !token || !leave) return;
    const data = new FormData();
    data.append("csrfmiddlewaretoken", token);
    data.append("leave", "1");
    data.append("tab", PRESENCE_TAB);
    navigator.sendBeacon?.(url, data);
  }

  function startPresence() {
    // The heartbeat itself is declarative (hx-post every 10 s on [data-presence-beat]); leaving is not.
    const review = $("[data-review]");
    if (!review || !review.hasAttribute("data-open-request")) return;
    document.body.addEventListener("htmx:configRequest", (event) => {
      if (event.detail.elt?.matches?.("[data-presence-beat]")) event.detail.parameters.tab = PRESENCE_TAB;
    });
    // The beat's answer is who else looks now: shown, it puts right within one beat a change whose notice the
    // socket never heard (sent while it was down, or lost), instead of naming someone long gone for good.
    document.body.addEventListener("htmx:afterRequest", (event) => {
      const { elt, xhr } = event.detail;
      if (!elt?.matches?.("[data-presence-beat]") || !xhr || xhr.status !== 200) return;
      if (!review.hasAttribute("data-open-request")) return;
      $$(`[data-presence-for="${CSS.escape(review.dataset.request)}"]`, review).forEach((el) => {
        el.innerHTML = xhr.responseText;
      });
    });
    window.addEventListener("pagehide", () => sendPresence(true));
  }

  // --- client-side checks: the same rules the server applies (schema_forms.clean) --------------------

  // Any script's decimal digits, as the server reads them (Python's \d): ۱۲ is twelve in Persian.
  const INTEGER = /^[+-]?\p{Nd}+$/u;
  const DECIMAL = /^[+-]?(\p{Nd}+(\.\p{Nd}*)?|\.\p{Nd}+)([eE][+-]?\p{Nd}{1,4})?$/u;
  const ASCII = /^[\x00-\x7f]*$/;

  function checkField(field) {
    const d = field.dataset;
    const kind = d.kind;
    const inputs = $$(`[name="${CSS.escape(d.name)}"]`, field);
    if (kind === "boolean") return "";
    if (kind === "multi_select") {
      const count = inputs.filter((i) => i.checked).length;
      if (d.minItems && count < Number(d.minItems) && (count > 0 || "required" in d)) return d.minItemsMessage || fmt(T.minItems, { count: d.minItems });
      if (d.maxItems && count > Number(d.maxItems)) return d.maxItemsMessage || fmt(T.maxItems, { count: d.maxItems });
      return "";
    }
    if (kind === "single_select") {
      const value = inputs.length === 1 && inputs[0].tagName === "SELECT" ? inputs[0].value : (inputs.find((i) => i.checked)?.value || "");
      return value === "" && "required" in d ? T.required : "";
    }
    const input = inputs[0];
    const value = input.value.replace(/\r\n?/g, "\n").trim();
    if (value === "") return "required" in d ? T.required : "";
    if (kind === "integer" || kind === "number") {
      if (kind === "integer" ? !INTEGER.test(value) : !DECIMAL.test(value)) return kind === "integer" ? T.wholeNumber : T.number;
      if (!ASCII.test(value)) return ""; // Number() reads ASCII digits only: the server checks the bounds
      const n = Number(value);
      if (d.minimum !== undefined && n < Number(d.minimum)) return fmt(T.atLeast, { limit: d.minimum });
      if (d.maximum !== undefined && n > Number(d.maximum)) return fmt(T.atMost, { limit: d.maximum });
      return "";
    }
    const length = Array.from(value).length;
    if (d.minLength && length < Number(d.minLength)) return d.minLengthMessage || fmt(T.minLength, { count: d.minLength });
    if (d.maxLength && length > Number(d.maxLength)) return d.maxLengthMessage || fmt(T.maxLength, { count: d.maxLength });
    if (!input.checkValidity()) return T[kind] || T.required; // email, url, date, datetime-local
    return "";
  }

  function showErrors(form, problems) {
    const slot = $("[data-error-summary-slot]", form);
    $$("[data-field]", form).forEach((field) => {
      const message = problems.get(field) || "";
      field.classList.toggle("has-error", !!message);
      const error = $("[data-field-error]", field);
      error.textContent = message;
      error.hidden = !message;
      const target = $(`#${CSS.escape(field.dataset.inputId)}`, field);
      if (target) {
        const hint = `${field.dataset.inputId}-hint`;
        target.setAttribute("aria-describedby", message ? `${hint} ${error.id}` : hint);
        if (message) target.setAttribute("aria-invalid", "true"); else target.removeAttribute("aria-invalid");
      }
    });
    if (!problems.size) { slot.innerHTML = ""; return; }
    const box = document.createElement("div");
    box.className = "error-summary";
    box.setAttribute("role", "alert");
    box.tabIndex = -1;
    const title = document.createElement("h2");
    title.textContent = T.problem;
    const list = document.createElement("ul");
    problems.forEach((message, field) => {
      const item = document.createElement("li");
      const link = document.createElement("a");
      link.href = "#" + field.dataset.inputId;
      // The field's name as the server's summary gives it: without "(optional)".
      const label = $("label bdi, legend bdi", field)?.textContent.trim() || field.dataset.name;
      link.textContent = `${label}: ${message}`;
      item.appendChild(link);
      list.appendChild(item);
    });
    box.append(title, list);
    slot.replaceChildren(box);
    box.focus();
  }

  function setUpAnswerForm(form) {
    form.addEventListener("submit", (event) => {
      if (form.dataset.clientChecks !== "off") {
        const problems = new Map();
        $$("[data-field]", form).forEach((field) => {
          const message = checkField(field);
          if (message) problems.set(field, message);
        });
        showErrors(form, problems);
        if (problems.size) { event.preventDefault(); return; }
      }
      sendingState(form);
    });
    // Enter in a field never submits (the hidden default button already blocks it without this script).
    form.addEventListener("keydown", (event) => {
      if (event.key === "Enter" && !(event.ctrlKey || event.metaKey) && event.target.tagName === "INPUT") event.preventDefault();
    });
    const tz = $("[data-tz-input]", form);
    if (tz && !tz.value) {
      try { tz.value = Intl.DateTimeFormat().resolvedOptions().timeZone; } catch (e) { /* keep empty */ }
    }
  }

  // The page drawn in answer to a refused decision (a POST) takes the request's own address: reloading it,
  // or coming back to it, reads the request afresh instead of asking to send the form again.
  function ownAddress(review) {
    const own = review.dataset.pageUrl;
    if (own && location.pathname !== own) history.replaceState(null, "", own);
  }

  // The decision bar sticks to the bottom of the window: a field reached with Tab scrolls clear of it.
  function clearOfDecisionBar(review) {
    const bar = $("[data-decision]", review);
    if (!bar || !("ResizeObserver" in window)) return;
    const root = document.documentElement;
    new ResizeObserver(() => {
      root.style.setProperty("--decision-height", `${Math.ceil(bar.getBoundingClientRect().height) + 8}px`);
    }).observe(bar);
  }

  function setUpReview() {
    const review = $("[data-review]");
    if (!review) return;
    ownAddress(review);
    clearOfDecisionBar(review);
    if (!review.hasAttribute("data-open-request")) {
      // Drawn locked (answered meanwhile, or not this reviewer's to answer): what was typed stays copyable.
      $$("[data-decision] button, [data-second-look] button", review).forEach((el) => { el.disabled = true; });
      $$("[data-form-body][disabled], [data-decision] fieldset[disabled]", review).forEach((el) => { el.disabled = false; });
      keepForCopying(review);
    }
    const form = $("[data-answer-form]", review);
    if (form) setUpAnswerForm(form);
    $$("[data-decision-form]", review).forEach((f) => f.addEventListener("submit", () => sendingState(f)));
    $$("[data-reason]", review).forEach((chip) => chip.addEventListener("click", () => {
      const area = $("#decline-reason");
      area.value = chip.textContent.trim();
      area.focus();
    }));
    const openForm = $("[data-open-form]");
    if (openForm) {
      openForm.addEventListener("submit", () => {
        const after = $("[data-url-after]");
        if (after) after.hidden = false;
        window.setTimeout(() => $$("[data-decision] button").forEach((b) => { b.disabled = true; }), 0);
      });
    }
    const focusTarget = $("[data-autofocus]", review);
    if (focusTarget) focusTarget.focus();
    armApprove();
    startPresence();
  }

  // --- keyboard ----------------------------------------------------------------------------------------

  const toggle = $("#shortcuts-toggle");
  const singleKeysOn = () => localStorage.getItem("elicit.singleKeys") !== "off";
  if (toggle) {
    toggle.checked = singleKeysOn();
    toggle.addEventListener("change", () => localStorage.setItem("elicit.singleKeys", toggle.checked ? "on" : "off"));
  }

  function rows() { return $$(".request-row[data-pending-request]"); }

  function select(row, focus = true) {
    $$(".request-row.is-selected").forEach((r) => r.classList.remove("is-selected"));
    if (!row) return;
    row.classList.add("is-selected");
    const link = $("[data-open]", row);
    if (link && focus) link.focus({ preventScroll: false });
  }

  function move(step) {
    const list = rows();
    if (!list.length) return;
    const current = list.findIndex((r) => r.classList.contains("is-selected"));
    const next = current === -1 ? (step > 0 ? 0 : list.length - 1) : Math.min(list.length - 1, Math.max(0, current + step));
    select(list[next]);
  }

  function submitOf(form) {
    return [...form.querySelectorAll("button[type=submit]")].find((b) => !b.hidden) || null;
  }

  // Whether the reviewer changed anything on the request page (a value, a choice, a decline reason).
  function unsent(review) {
    if (!review.hasAttribute("data-open-request")) return false;
    return $$(":is([data-form-body], [data-decision]) :is(input, select, textarea)", review).some((el) => {
      if (el.type === "hidden" || el.matches("[data-tz-input]")) return false;
      if (el.type === "checkbox" || el.type === "radio") return el.checked !== el.defaultChecked;
      if (el.tagName === "SELECT") return [...el.options].some((o) => o.selected !== o.defaultSelected);
      return el.value !== el.defaultValue;
    });
  }

  function typing(target) {
    return target.closest("input, textarea, select, [contenteditable]") !== null;
  }

  document.addEventListener("keydown", (event) => {
    const review = $("[data-review]");
    if ((event.ctrlKey || event.metaKey) && event.key === "Enter") {
      // Inside a decision form (a decline reason, edited arguments) it sends what is being written there,
      // never the page's approval: an approval is only of what is shown, the arguments as asked.
      const approve = $("[data-approve]");
      const writing = event.target.closest?.("form[data-decision-form]");
      const button = writing && !(approve && approve.form === writing) ? submitOf(writing) : approve;
      if (review && button && !button.matches(":disabled")) {
        event.preventDefault();
        button.click();
      }
      return;
    }
    if (event.key === "Escape") {
      const help = $("#shortcuts-help");
      if (help?.open) return; // the dialog closes itself
      const decline = $("[data-decline]");
      if (decline?.open) { decline.open = false; $("[data-decline-toggle]")?.focus(); return; }
      if (typing(event.target)) { event.target.blur(); return; }
      const back = $("[data-back]");
      // Esc never throws away an answer being written: it only moves to the way back, for Enter to take.
      if (back && review && unsent(review)) { back.focus(); return; }
      if (back) { location.href = back.href; }
      return;
    }
    if (event.ctrlKey || event.metaKey || event.altKey || typing(event.target) || !singleKeysOn()) return;
    const queue = $("[data-queue]");
    switch (event.key) {
      case "j": if (queue) { event.preventDefault(); move(1); } break;
      case "k": if (queue) { event.preventDefault(); move(-1); } break;
      case "o": {
        const row = $(".request-row.is-selected");
        if (row) { event.preventDefault(); location.href = $("[data-open]", row).href; }
        break;
      }
      case "d": {
        if (review) {
          if (openDecline()) event.preventDefault();
        } else if (queue) {
          const row = $(".request-row.is-selected");
          if (row) { event.preventDefault(); location.href = $("[data-open]", row).href + "#decline"; }
        }
        break;
      }
      case "?": { event.preventDefault(); $("#shortcuts-help")?.showModal(); break; }
      default: break;
    }
  });

  // "Decline…" opened, its reason focused: only on a request still open to this reviewer (one answered, or
  // not theirs to answer, keeps its decline closed: nothing could be sent from it).
  function openDecline() {
    const decline = $("[data-review][data-open-request] [data-decline]");
    if (!decline || decline.inert) return false;
    decline.open = true;
    $("#decline-reason")?.focus();
    return true;
  }

  $$("[data-show-help]").forEach((b) => b.addEventListener("click", () => $("#shortcuts-help")?.showModal()));

  // --- filters: a pointer's choice applies at once ---------------------------------------------------

  // A choice made with the pointer applies at once. From the keyboard it waits for the Filter button: arrow
  // keys step a closed select through its choices, each step a "change", and a reload at the first would
  // take the page, and the focus, from under the reviewer's keys.
  const filters = $("[data-filters]");
  if (filters) {
    let byPointer = false;
    $$("select", filters).forEach((s) => {
      s.addEventListener("pointerdown", () => { byPointer = true; });
      s.addEventListener("keydown", () => { byPointer = false; });
      s.addEventListener("change", () => { if (byPointer) filters.requestSubmit(); });
    });
  }

  // --- start -------------------------------------------------------------------------------------------

  localiseTimes(document);
  tick();
  window.setInterval(tick, 1000);
  setUpReview();
  if (location.hash === "#decline") openDecline();
  const summary = $(".error-summary[data-autofocus]");
  if (summary) summary.focus();
  if (document.body.dataset.liveUrl) connect();
  updateCount();
})();
