/*
 * OwlLayer microphone capture, an AudioWorklet processor ("owllayer-capture")
 * that owllayer-client.js loads from beside itself (a static file, so no
 * blob: or inline script is needed under a strict CSP).
 *
 * It turns the microphone into what AITP's AUDIO_STREAM carries: 16 kHz mono
 * 16-bit little-endian PCM, in chunks of `chunkSamples` (4096, 256 ms). When
 * the context runs at another rate, each 16 kHz sample is the mean of the
 * input samples of its interval (a box filter against aliasing; the client
 * asks for a 16 kHz context, so this is normally a no-op).
 *
 * It also tells the page when someone speaks: a simple level detector over
 * 20 ms windows ("speech" after `speechMs` above `threshold`, "silence"
 * after `silenceMs` below it), which the client uses for barge-in. The
 * detector hears a word only once it has begun, so the last
 * `prerollSamples` (16 kHz) are kept: an utterance a barge-in starts begins
 * with them, the whole word instead of its tail.
 *
 * Messages in:  {type: "start"}  drop what was captured so far;
 *               {type: "start", preroll: true}  the same, but begin with
 *                                 the last `prerollSamples`;
 *               {type: "flush"}  post the partial chunk now, as final.
 * Messages out: {type: "chunk", pcm: ArrayBuffer, final},
 *               {type: "speech"}, {type: "silence"}.
 */
const TARGET_RATE = 16000;
const WINDOW_SAMPLES = TARGET_RATE / 50; // 20 ms

class OwlLayerCapture extends AudioWorkletProcessor {
  constructor(options) {
    super();
    const settings = (options && options.processorOptions) || {};
    this.chunkSamples = settings.chunkSamples || 4096;
    this.threshold = settings.threshold || 0.02;
    this.speechWindows = Math.max(1, Math.round((settings.speechMs || 120) / 20));
    this.silenceWindows = Math.max(1, Math.round((settings.silenceMs || 600) / 20));
    // Input samples per output sample; the interval's samples are averaged.
    this.step = sampleRate / TARGET_RATE;
    this.phase = 0;
    this.sum = 0;
    this.count = 0;
    this.chunk = new Int16Array(this.chunkSamples);
    this.filled = 0;
    // The latest samples, a ring: what a barge-in's utterance begins with.
    this.recent = new Int16Array(Math.max(0, Math.round(settings.prerollSamples || 0)));
    this.recentAt = 0;
    this.recentFilled = 0;
    // The level detector.
    this.energy = 0;
    this.windowFill = 0;
    this.loud = 0;
    this.quiet = 0;
    this.speaking = false;
    this.port.onmessage = (event) => this.command(event.data || {});
  }

  command(message) {
    if (message.type === "start") {
      this.filled = 0;
      if (message.preroll) this.replayRecent();
    } else if (message.type === "flush") {
      this.post(true);
    }
  }

  post(final) {
    const pcm = new ArrayBuffer(this.filled * 2);
    const view = new DataView(pcm);
    for (let i = 0; i < this.filled; i++) view.setInt16(i * 2, this.chunk[i], true);
    this.filled = 0;
    this.port.postMessage({ type: "chunk", pcm, final }, [pcm]);
  }

  /* The kept samples, oldest first, into the new utterance's chunks. */
  replayRecent() {
    const size = this.recent.length;
    for (let i = size - this.recentFilled; i < size; i++) {
      this.append(this.recent[(this.recentAt + i) % size]);
    }
  }

  append(sample) {
    this.chunk[this.filled++] = sample;
    if (this.filled === this.chunkSamples) this.post(false);
  }

  /* One 16 kHz sample: into the chunk, the kept samples and the level detector. */
  emit(value) {
    const clipped = Math.max(-1, Math.min(1, value));
    const sample = clipped < 0 ? clipped * 0x8000 : clipped * 0x7fff;
    this.append(sample);
    if (this.recent.length) {
      this.recent[this.recentAt] = sample;
      this.recentAt = (this.recentAt + 1) % this.recent.length;
      this.recentFilled = Math.min(this.recentFilled + 1, this.recent.length);
    }
    this.energy += clipped * clipped;
    if (++this.windowFill === WINDOW_SAMPLES) this.judgeWindow();
  }

  judgeWindow() {
    const loud = Math.sqrt(this.energy / WINDOW_SAMPLES) >= this.threshold;
    this.energy = 0;
    this.windowFill = 0;
    if (loud) {
      this.quiet = 0;
      this.loud += 1;
      if (!this.speaking && this.loud >= this.speechWindows) {
        this.speaking = true;
        this.port.postMessage({ type: "speech" });
      }
    } else {
      this.loud = 0;
      this.quiet += 1;
      if (this.speaking && this.quiet >= this.silenceWindows) {
        this.speaking = false;
        this.port.postMessage({ type: "silence" });
      }
    }
  }

  process(inputs) {
    const channel = inputs[0] && inputs[0][0];
    if (!channel) return true;
    for (let i = 0; i < channel.length; i++) {
      this.sum += channel[i];
      this.count += 1;
      this.phase += 1;
      // Downsampling: one output per `step` inputs; upsampling repeats it.
      while (this.phase >= this.step) {
        this.emit(this.sum / this.count);
        this.phase -= this.step;
        if (this.phase >= this.step) continue;
        this.sum = 0;
        this.count = 0;
      }
    }
    return true;
  }
}

registerProcessor("owllayer-capture", OwlLayerCapture);
