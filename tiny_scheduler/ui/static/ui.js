// The dashboard's one script. It keeps the open page current: from the scheduler's job events
// (an EventSource on /ui/events) where the page says so, else, or when the stream fails, by
// reloading its content every few seconds. It keeps relative times ("3 min ago") current in
// between, follows a running job's output as it grows, shows a chart minute's numbers where
// it is pointed at or tapped, and asks before an action. Every page works without it.
//
// A tab in the background gives its stream and output reads up, and opens them again when it
// is shown: a browser holds only six connections to one server, and tabs left open elsewhere
// must not keep the one being looked at from going live (issue 36: one tab said "auto-refresh"
// while the others said "live"). Until its stream opens, a page says it is connecting.
(function () {
  "use strict";

  var PAUSED_KEY = "tiny-scheduler.refresh-paused";
  var UNITS = [[86400, "d"], [3600, "h"], [60, "min"], [1, "s"]];
  // Seconds an output read may wait on the server for more (the API allows up to 30).
  var OUTPUT_WAIT_SECS = 25;
  // While events drive the page, it is still reloaded this rarely: a node's health and
  // heartbeat change without a job event.
  var EVENTS_FALLBACK_FACTOR = 12;
  // After the event stream failed, it is asked for again after this long, twice as long
  // each time it fails again (up to the last), each wait up to half as much again: pages
  // refused together (a full scheduler) must not come back together.
  var STREAM_RETRY_FIRST_MS = 30000;
  var STREAM_RETRY_MAX_MS = 300000;
  var body = document.body;
  var every = (Number(body.dataset.refreshSecs) || 5) * 1000;
  var state = document.getElementById("refresh-state");
  var toggle = document.getElementById("refresh-toggle");
  var paused = readPaused();
  var busy = false;
  var again = false; // an event came while a refresh was under way: one more after it
  var stale = false; // an event came while paused: refresh on resume
  var mode = body.dataset.eventsUrl && window.EventSource ? "connecting" : "timer";
  // "events" while the event stream is open, "hidden" while the tab is in the background
  var source = null;
  var ticks = 0;
  var skewMs = 0; // server clock minus browser clock, so relative times match the server's
  var heldUntil = 0; // a 503 said when to come back (Retry-After): no reload before then
  var missed = false; // a reload was wanted while held: do it once the hold is over
  var streamRetryMs = STREAM_RETRY_FIRST_MS;

  // What the browser tests read: how the page is kept current, and how often it was.
  var status = (window.tinyScheduler = {
    mode: mode,
    refreshes: 0,
    events: 0,
    ignored: 0,
    heldUntil: 0,
    streamRetries: 0,
    ticks: 0,
  });
  var left = false; // the page was left: no feed is opened again

  function readPaused() {
    try {
      return window.localStorage.getItem(PAUSED_KEY) === "1";
    } catch (e) {
      return false; // storage disabled: just never remember the choice
    }
  }

  function savePaused() {
    try {
      window.localStorage.setItem(PAUSED_KEY, paused ? "1" : "0");
    } catch (e) {
      // storage disabled: the choice lasts for this page only
    }
  }

  // Same wording as tiny_scheduler/ui/formatting.py relative_time().
  function relative(ms) {
    var seconds = Math.abs(ms) / 1000;
    if (seconds < 1) {
      return "just now";
    }
    for (var i = 0; i < UNITS.length; i++) {
      if (seconds >= UNITS[i][0]) {
        var text = Math.floor(seconds / UNITS[i][0]) + " " + UNITS[i][1];
        return ms > 0 ? text + " ago" : "in " + text;
      }
    }
    return "just now";
  }

  // A path made absolute on this origin: fetch() refuses a relative URL when the page was
  // opened with credentials in its address (http://user:key@host/ui/), and
  // location.origin never carries them.
  function here(path) {
    return window.location.origin + path;
  }

  function learnSkew(content) {
    var serverNow = Number(content.dataset.nowMs);
    if (serverNow) {
      skewMs = serverNow - Date.now();
    }
  }

  function updateTimes() {
    var now = Date.now() + skewMs;
    document.querySelectorAll("time[data-ms]").forEach(function (el) {
      el.textContent = relative(now - Number(el.dataset.ms));
    });
  }

  function show(text, isStale) {
    state.textContent = text;
    state.classList.toggle("stale", Boolean(isStale));
  }

  function showMode() {
    toggle.textContent = paused ? "Resume" : "Pause";
    if (paused) {
      show("auto-refresh paused");
    } else if (mode === "events") {
      show("live");
    } else if (mode === "connecting") {
      show("connecting…");
    } else {
      show("auto-refresh every " + every / 1000 + " s");
    }
  }

  // Don't pull the page from under someone reading a selection or typing in a field.
  function userIsBusy(content) {
    var selection = window.getSelection();
    if (selection && !selection.isCollapsed && content.contains(selection.anchorNode)) {
      return true;
    }
    var active = document.activeElement;
    return Boolean(active && content.contains(active) && /^(INPUT|SELECT|TEXTAREA)$/.test(active.tagName));
  }

  function swap(content, fresh) {
    var open = [];
    content.querySelectorAll("details[open][id]").forEach(function (el) {
      open.push(el.id);
    });
    // A followed output keeps its element (and what it has read so far) while the job runs:
    // the server renders it empty until the job ends.
    var followed = {};
    content.querySelectorAll("pre[data-stream][id]").forEach(function (el) {
      followed[el.id] = el;
    });
    content.innerHTML = fresh.innerHTML;
    content.dataset.nowMs = fresh.dataset.nowMs || "";
    open.forEach(function (id) {
      var el = document.getElementById(id);
      if (el) {
        el.open = true;
      }
    });
    Object.keys(followed).forEach(function (id) {
      var el = document.getElementById(id);
      if (el && el.dataset.stream) {
        el.replaceWith(followed[id]);
      }
    });
    startFollowing(); // a job that started since the last look
  }

  function refresh() {
    var content = document.getElementById("content");
    if (!content || document.hidden || userIsBusy(content)) {
      return;
    }
    if (paused) {
      stale = true;
      return;
    }
    if (busy) {
      again = true;
      return;
    }
    if (Date.now() < heldUntil) {
      missed = true; // the scheduler asked for a pause: after it, one reload for all of these
      return;
    }
    busy = true;
    again = false;
    missed = false;
    fetch(here(window.location.pathname + window.location.search), { cache: "no-store", credentials: "same-origin", signal: reads.signal })
      .then(function (response) {
        var wait = Number(response.headers.get("Retry-After"));
        if (response.status === 503 && wait > 0) {
          // Nothing was done (too many connections, no leader): come back when it says.
          heldUntil = status.heldUntil = Date.now() + wait * 1000 * (1 + Math.random() / 2);
          throw new Error("busy");
        }
        if (!response.ok) {
          throw new Error("HTTP " + response.status);
        }
        return response.text();
      })
      .then(function (html) {
        var page = new DOMParser().parseFromString(html, "text/html");
        var fresh = page.getElementById("content");
        if (!fresh) {
          throw new Error("no content in the page");
        }
        swap(content, fresh);
        learnSkew(content);
        updateTimes();
        status.refreshes += 1;
        showMode();
      })
      .catch(function (error) {
        if (error && error.message === "busy") {
          show("the scheduler is busy; next look in " + Math.ceil((heldUntil - Date.now()) / 1000) + " s", true);
        } else {
          show("refresh failed, retrying", true);
        }
      })
      .then(function () {
        busy = false;
        if (again) {
          refresh();
        }
      });
  }

  function tick() {
    ticks += 1;
    status.ticks = ticks;
    if (mode === "hidden") {
      return;
    }
    if (mode !== "events" || (missed && Date.now() >= heldUntil) || ticks % EVENTS_FALLBACK_FACTOR === 0) {
      refresh(); // connecting counts as the timer until the stream opens
    }
  }

  // --- job events ------------------------------------------------------------------------

  function setMode(next) {
    mode = status.mode = next;
    showMode();
  }

  function fallBack() {
    if (source) {
      source.close(); // not the browser's own reconnecting at once: the timer, then later again
      source = null;
    }
    setMode("timer");
    refresh(); // whatever happened while the stream was down
    var wait = streamRetryMs * (1 + Math.random() / 2);
    streamRetryMs = Math.min(streamRetryMs * 2, STREAM_RETRY_MAX_MS);
    window.setTimeout(function () {
      status.streamRetries += 1;
      listen();
    }, wait);
  }

  function jobOf(event) {
    try {
      return JSON.parse(event.data).job_id;
    } catch (e) {
      return null; // not what the API sends: refresh rather than miss a change
    }
  }

  function listen() {
    var url = body.dataset.eventsUrl;
    if (!url || !window.EventSource || left || document.hidden || source) {
      return; // (a hidden tab opens its stream again when it is shown)
    }
    source = new EventSource(url);
    source.addEventListener("open", function () {
      streamRetryMs = STREAM_RETRY_FIRST_MS;
      setMode("events");
    });
    source.addEventListener("job", function (event) {
      status.events += 1;
      // A job's page changes only with that job; every other page may show any job.
      var only = document.querySelector("[data-job-page]");
      if (only && jobOf(event) !== only.dataset.jobPage) {
        status.ignored += 1;
        return;
      }
      refresh();
    });
    // The server lost track of what this stream has seen: read the page afresh, then carry on.
    source.addEventListener("reset", function () {
      refresh();
    });
    source.addEventListener("error", fallBack);
  }

  // --- a running job's output --------------------------------------------------------------

  var decoders = {};

  function append(pre, text, className) {
    if (!text) {
      return;
    }
    var atBottom = pre.scrollTop + pre.clientHeight >= pre.scrollHeight - 4;
    var piece = className ? document.createElement("span") : document.createTextNode(text);
    if (className) {
      piece.className = className;
      piece.textContent = text;
    }
    pre.appendChild(piece);
    if (atBottom) {
      pre.scrollTop = pre.scrollHeight; // keep following the end, unless scrolled up
    }
  }

  function follow(pre, url) {
    var offset = Number(pre.dataset.offset) || 0;
    var query = "?stream=" + pre.dataset.stream + "&offset=" + offset + "&wait=" + OUTPUT_WAIT_SECS;
    fetch(here(url + query), { cache: "no-store", credentials: "same-origin", signal: reads.signal })
      .then(function (response) {
        if (!response.ok) {
          throw new Error("HTTP " + response.status);
        }
        return response.arrayBuffer().then(function (bytes) {
          return {
            bytes: bytes,
            next: Number(response.headers.get("X-Output-Offset")),
            status: response.headers.get("X-Job-Status"),
          };
        });
      })
      .then(function (read) {
        // The read starts at `next - length`; past our offset means the cap dropped bytes.
        var start = read.next - read.bytes.byteLength;
        if (start > offset) {
          append(pre, "[… " + (start - offset) + " bytes skipped …]\n", "skipped");
        }
        var decoder = decoders[pre.id] || (decoders[pre.id] = new TextDecoder("utf-8"));
        append(pre, decoder.decode(read.bytes, { stream: true }));
        pre.dataset.offset = String(read.next);
        if (read.status === "running") {
          follow(pre, url);
        } else {
          pre.removeAttribute("data-stream"); // the page shows the final report from now on
          pre.dataset.ended = read.status;
          refresh();
        }
      })
      .catch(function () {
        pre.dataset.following = "";
        // Try again on the next refresh (startFollowing), not in a tight loop.
      });
  }

  function startFollowing() {
    var section = document.querySelector("[data-live-output]");
    if (!section) {
      return;
    }
    section.querySelectorAll("pre[data-stream]").forEach(function (pre) {
      if (pre.dataset.following !== "yes") {
        pre.dataset.following = "yes";
        follow(pre, section.dataset.liveOutput);
      }
    });
  }

  // --- a chart minute's numbers, for touch screens too --------------------------------------

  function readout(event) {
    var minute = event.target.closest && event.target.closest("rect.minute");
    var out = document.getElementById("chart-readout");
    if (minute && out) {
      out.textContent = minute.textContent;
    }
  }

  document.addEventListener("click", readout);
  document.addEventListener("mouseover", readout);

  document.addEventListener("submit", function (event) {
    var question = event.target.dataset.confirm;
    if (question && !window.confirm(question)) {
      event.preventDefault();
    }
  });

  toggle.hidden = false;
  toggle.addEventListener("click", function () {
    paused = !paused;
    savePaused();
    showMode();
    if (!paused && (stale || mode === "timer")) {
      stale = false;
      refresh();
    }
  });

  // A browser holds only a few connections per server: a page left behind (or kept in the
  // back/forward cache), or a tab in the background, must not keep its event stream or output
  // reads open.
  function letGo() {
    if (source) {
      source.close();
      source = null;
    }
    reads.abort();
    reads = new AbortController();
    document.querySelectorAll("pre[data-stream]").forEach(function (pre) {
      pre.dataset.following = ""; // followed again, from where it was, when shown
    });
  }

  window.addEventListener("pagehide", function () {
    left = true;
    letGo();
  });
  document.addEventListener("visibilitychange", function () {
    if (document.hidden) {
      letGo();
      setMode("hidden");
      return;
    }
    setMode(body.dataset.eventsUrl && window.EventSource ? "connecting" : "timer");
    listen();
    refresh(); // whatever happened while it was hidden
    startFollowing();
  });
  window.addEventListener("pageshow", function (event) {
    if (event.persisted) {
      window.location.reload(); // back from the cache: the page is stale and its feeds closed
    }
  });

  var reads = new AbortController(); // the page's fetches: aborted when it is let go of
  var content = document.getElementById("content");
  if (content) {
    learnSkew(content);
  }
  showMode();
  updateTimes();
  listen();
  startFollowing();
  window.setInterval(updateTimes, 1000);
  window.setInterval(tick, every);
})();
