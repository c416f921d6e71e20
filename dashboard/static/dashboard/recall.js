/* Recall's pages: the little they do in the browser. A file, not inline code,
   so that their Content-Security-Policy can refuse every inline script.
   The templates ask for it with data attributes:
     <form data-confirm="Question?">    submits only if the user agrees;
     <select data-autosubmit>           submits its form when picked (by keyboard: on Enter);
     <input data-checks="radio-id">     ticks that radio button when focused;
     <div id="x" data-refreshing="3" data-refresh-url="/url/">
                                        fetches that URL after that many seconds and puts
                                        its element of the same id in place of this one,
                                        again while the new one says data-refreshing: the
                                        rest of the page (what is typed, the focus) stays;
                                        when the new one no longer says it, its
                                        [data-settled] notice shows (its [data-here] link
                                        leads to this page afresh); when the sign-in page
                                        comes back instead, a note says it stopped. */
"use strict";

document.addEventListener("submit", function (event) {
  var question = event.target.getAttribute("data-confirm");
  if (question && !window.confirm(question)) {
    event.preventDefault();
  }
});

// A pick with the pointer submits at once. Arrow keys on a closed select
// change it too, one option per press: those changes wait for the form's
// own button, so a keyboard can step through the options (WCAG 3.2.2).
var STEPPING_KEYS = ["ArrowUp", "ArrowDown", "ArrowLeft", "ArrowRight", "Home", "End",
  "PageUp", "PageDown"];

document.addEventListener("keydown", function (event) {
  var select = event.target;
  if (select.tagName !== "SELECT" || !select.hasAttribute("data-autosubmit")) {
    return;
  }
  if (event.key === "Enter") {
    // Chosen: once the select has taken the choice, the form goes.
    delete select.dataset.keyed;
    window.setTimeout(function () { select.form.requestSubmit(); }, 0);
  } else if (STEPPING_KEYS.indexOf(event.key) >= 0 || event.key.length === 1) {
    select.dataset.keyed = "1";
  }
});

document.addEventListener("pointerdown", function (event) {
  if (event.target.hasAttribute && event.target.hasAttribute("data-autosubmit")) {
    delete event.target.dataset.keyed;
  }
});

document.addEventListener("change", function (event) {
  var select = event.target;
  if (select.hasAttribute("data-autosubmit") && !select.dataset.keyed) {
    select.form.submit();
  }
});

document.addEventListener("focusin", function (event) {
  var radio = event.target.getAttribute("data-checks");
  if (radio) {
    document.getElementById(radio).checked = true;
  }
});

// Nothing on its way any more: what the rest of the page shows predates it, so the
// notice that offers the page afresh shows (no reload of its own: it would wipe what
// is being typed).
function settled(element) {
  element.querySelectorAll("[data-here]").forEach(function (link) {
    link.href = window.location.pathname + window.location.search;
  });
  element.querySelectorAll("[data-settled]").forEach(function (notice) {
    notice.hidden = false;
  });
}

function stopped(element) {
  element.removeAttribute("data-refreshing");
  var note = document.createElement("p");
  note.className = "notice warn";
  note.textContent = "No longer updating: you are signed out. Sign in again and reload this " +
    "page to see where it stands.";
  element.prepend(note);
}

function refreshLater(element) {
  var seconds = Number(element.getAttribute("data-refreshing"));
  var url = element.getAttribute("data-refresh-url");
  if (!url || !element.id) {
    return;
  }
  window.setTimeout(function () {
    fetch(url, { credentials: "same-origin", headers: { "Accept": "text/html" } })
      .then(function (response) {
        if (!response.ok) {
          throw new Error("HTTP " + response.status);
        }
        return response.text();
      })
      .then(function (text) {
        var parsed = new DOMParser().parseFromString(text, "text/html");
        var fresh = parsed.getElementById(element.id);
        if (!fresh) {
          stopped(element); // signed out meanwhile (the sign-in page came back)
          return;
        }
        fresh = document.importNode(fresh, true);
        // What the user opened stays open (a report's "which" list).
        element.querySelectorAll("details[open][data-keep]").forEach(function (open) {
          var twin = fresh.querySelector('details[data-keep="' + open.dataset.keep + '"]');
          if (twin) {
            twin.open = true;
          }
        });
        element.replaceWith(fresh);
        if (fresh.hasAttribute("data-refreshing")) {
          refreshLater(fresh);
        } else {
          settled(fresh);
        }
      })
      .catch(function () {
        refreshLater(element); // the server did not answer this time: ask again later
      });
  }, seconds * 1000);
}

document.querySelectorAll("[data-refreshing]").forEach(refreshLater);
